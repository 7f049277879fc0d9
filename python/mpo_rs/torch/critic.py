"""Critics built from a policy (needs torch).

:func:`value_head_critic` copies a causal LM and swaps its LM head for a scalar head, so
the critic starts from the policy's trunk and outputs one value per position:
``(B, L, 1)`` logits, which :func:`mpo_rs.torch.model_io.token_values` reads as V(tokens < q)
from the output at q - 1, like the policy's log-probs.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..exceptions import InvalidOptionError

__all__ = ["value_head_critic"]


def value_head_critic(policy: nn.Module) -> nn.Module:
    """A deep copy of ``policy`` whose LM head (``get_output_embeddings()``, or the
    ``lm_head`` attribute) is replaced by ``nn.Linear(width, 1)``, initialised to zero so
    every value starts at 0. Works for :class:`~mpo_lab.train.models.TinyCausalLM` and
    Hugging Face causal LMs (tied input/output embeddings are untied in the copy). The
    policy itself is left untouched; the copy shares no parameter with it."""
    critic = copy.deepcopy(policy)
    get_head = getattr(critic, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else getattr(critic, "lm_head", None)
    if not isinstance(head, nn.Linear):
        raise InvalidOptionError(
            f"value_head_critic: {type(policy).__name__} has no linear LM head "
            "(get_output_embeddings() or .lm_head); build the critic by hand"
        )
    value_head = nn.Linear(head.in_features, 1, device=head.weight.device, dtype=head.weight.dtype)
    with torch.no_grad():
        value_head.weight.zero_()
        value_head.bias.zero_()
    set_head = getattr(critic, "set_output_embeddings", None)
    if callable(set_head):
        set_head(value_head)
    else:
        critic.lm_head = value_head
    config = getattr(critic, "config", None)
    if config is not None and getattr(config, "tie_word_embeddings", False):
        config.tie_word_embeddings = False  # so a later tie_weights() does not put the vocabulary head back
    return critic
