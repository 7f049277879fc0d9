"""Model I/O of the learner (needs torch): per-token log-probs, entropies and values of
right-padded ``(B, L)`` rows.

Conventions. ``token_log_probs(...)[:, q]`` is log pi(token q | tokens < q) and
``token_values(...)[:, q]`` is V(tokens < q): the model output at position q - 1 scores
token q, so position 0 (no context) gets 0. The policy is any module called as
``policy(input_ids=..., attention_mask=...)`` returning logits ``(B, L, V)`` or an object
with ``.logits`` (a Hugging Face causal LM); the critic returns values ``(B, L)`` or
``(B, L, 1)`` the same way. Results are fp32 whatever the model's dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..exceptions import InvalidRolloutError

__all__ = ["token_log_probs", "token_log_probs_and_entropy", "token_values"]


def _model_output(module: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    out = module(input_ids=input_ids, attention_mask=attention_mask)
    if hasattr(out, "logits"):
        out = out.logits
    elif isinstance(out, (tuple, list)):
        out = out[0]
    if not isinstance(out, Tensor):
        raise InvalidRolloutError(
            f"{type(module).__name__} returned {type(out).__name__}; expected a tensor or an object with .logits"
        )
    return out


def _scaled_logits(policy: nn.Module, input_ids: Tensor, attention_mask: Tensor, temperature: float) -> Tensor:
    """The fp32 logits at positions 0..L-2 (each scores the next token), over ``temperature``."""
    logits = _model_output(policy, input_ids, attention_mask)
    if logits.dim() != 3 or logits.shape[:2] != input_ids.shape:
        raise InvalidRolloutError(f"policy logits have shape {tuple(logits.shape)}, expected (B, L, vocab)")
    logits = logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    return logits


def _chosen_log_probs(logits: Tensor, input_ids: Tensor, log_norm: Tensor) -> Tensor:
    chosen = logits.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return nn.functional.pad(chosen - log_norm, (1, 0))


def token_log_probs(policy: nn.Module, input_ids: Tensor, attention_mask: Tensor, temperature: float = 1.0) -> Tensor:
    """log pi(token q | tokens < q) for every position of ``(B, L)`` rows, 0 at q = 0; fp32."""
    logits = _scaled_logits(policy, input_ids, attention_mask, temperature)
    return _chosen_log_probs(logits, input_ids, torch.logsumexp(logits, dim=-1))


def token_log_probs_and_entropy(
    policy: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    temperature: float = 1.0,
    *,
    entropy_grad: bool = True,
) -> tuple[Tensor, Tensor]:
    """``token_log_probs`` and the entropy of the distribution each token was drawn from,
    H_q = -sum_v pi(v | tokens < q) log pi(v | tokens < q) at ``temperature`` (0 at q = 0);
    ``entropy_grad=False`` computes the entropy without a graph (a metric only)."""
    logits = _scaled_logits(policy, input_ids, attention_mask, temperature)
    log_norm = torch.logsumexp(logits, dim=-1)
    log_probs = _chosen_log_probs(logits, input_ids, log_norm)
    with torch.enable_grad() if entropy_grad else torch.no_grad():
        # H = logsumexp(z) - sum_v softmax(z)_v z_v: one (B, L, V) temporary.
        entropy = log_norm - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)
    return log_probs, nn.functional.pad(entropy, (1, 0))


def token_values(critic: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """V(tokens < q) for every position of ``(B, L)`` rows (0 at q = 0); fp32."""
    out = _model_output(critic, input_ids, attention_mask)
    if out.dim() == 3 and out.shape[-1] == 1:
        out = out.squeeze(-1)
    if out.shape != input_ids.shape:
        raise InvalidRolloutError(f"critic output has shape {tuple(out.shape)}, expected (B, L) or (B, L, 1)")
    return nn.functional.pad(out[:, :-1].float(), (1, 0))
