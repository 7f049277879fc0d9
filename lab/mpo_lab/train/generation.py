"""The policy side of :func:`mpo_lab.train.sampler.sample` (needs torch): every episode's
tokens as device buffers (:class:`Sequences`), the model's next-token logits with or without
a KV cache (:class:`Model`), and one drawn token per row with its log-prob (:func:`draw`).
The sampler module owns the episodes and the loop that joins the two."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn

from mpo_rs.exceptions import InvalidOptionError, InvalidRolloutError

__all__ = ["Model", "Sequences", "draw", "model_vocab", "open_model"]


# --------------------------------------------------------------------------- token buffers


class Sequences:
    """Every episode's tokens so far, as ``(B, capacity)`` device buffers.

    ``compact``: each row is its tokens left-aligned (right padding, recompute mode).
    Otherwise every append adds the same columns to all rows and rows without a token
    there get a hole (KV-cache mode). Column ``capacity`` is a write-only trash column for
    the entries that are not real, so appends need no host synchronisation.
    """

    def __init__(self, rows: int, device: torch.device, compact: bool, capacity: int = 256) -> None:
        self.rows, self.device, self.compact = rows, device, compact
        self.capacity = capacity
        self.ids = torch.zeros(rows, capacity + 1, dtype=torch.long, device=device)
        self.real = torch.zeros(rows, capacity + 1, dtype=torch.bool, device=device)
        self.policy = torch.zeros(rows, capacity + 1, dtype=torch.bool, device=device)
        self.log_probs = torch.zeros(rows, capacity + 1, dtype=torch.float32, device=device)
        self.attention = torch.zeros(rows, capacity + 1, dtype=torch.long, device=device)
        """``real`` as the model's ``attention_mask`` (int64), kept so no call converts it."""
        self.lengths = torch.zeros(rows, dtype=torch.long, device=device)
        self.width = 0
        """Columns in use: the longest row (compact) or every column appended (holes)."""

    def _grow(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        capacity = max(needed, 2 * self.capacity)
        for name in ("ids", "real", "policy", "log_probs", "attention"):
            old = getattr(self, name)
            new = old.new_zeros(self.rows, capacity + 1)
            new[:, : self.capacity] = old[:, : self.capacity]
            setattr(self, name, new)
        self.capacity = capacity

    def append(self, tokens: Tensor, real: Tensor, *, policy: bool, log_probs: Tensor | None = None) -> None:
        """Adds ``(B, n)`` tokens; in each row the entries with ``real`` set, in order."""
        n = tokens.shape[1]
        if n == 0:
            return
        self._grow(self.width + n)
        if self.compact:
            dest = self.lengths[:, None] + real.long().cumsum(1) - 1
        else:
            dest = self.width + torch.arange(n, device=self.device)[None, :].expand(self.rows, n)
        dest = torch.where(real, dest, self.capacity)
        self.ids.scatter_(1, dest, tokens)
        self.real.scatter_(1, dest, real)
        self.attention.scatter_(1, dest, real.long())
        self.policy.scatter_(1, dest, real & policy)
        if log_probs is not None:
            self.log_probs.scatter_(1, dest, torch.where(real, log_probs, 0.0))
        self.lengths += real.sum(1)
        # Compact rows are as wide as the longest one: a bound known without a sync.
        self.width += n
        self.ids[:, self.capacity] = 0  # the trash column is never read, keep it a valid id
        self.real[:, self.capacity] = False

    def append_column(self, tokens: Tensor, real: Tensor, log_probs: Tensor) -> None:
        """KV-cache mode: one column of ``(B,)`` policy tokens, a hole where ``real`` is
        False -- what ``append(tokens[:, None], real[:, None], policy=True, ...)`` writes,
        with direct column writes (this runs once per generated token)."""
        self._grow(self.width + 1)
        w = self.width
        self.ids[:, w] = torch.where(real, tokens, 0)
        self.real[:, w] = real
        self.attention[:, w] = real
        self.policy[:, w] = real
        self.log_probs[:, w] = torch.where(real, log_probs, 0.0)
        self.lengths += real
        self.width += 1

    def shrink_width(self) -> None:
        """Compact mode: trims ``width`` to the longest row (one host read)."""
        if self.compact:
            self.width = int(self.lengths.max()) if self.rows else 0

    def padded(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        w = self.width
        return self.ids[:, :w], self.real[:, :w], self.policy[:, :w], self.log_probs[:, :w]


# --------------------------------------------------------------------------- model calls


def _parameters(module: nn.Module) -> tuple[set[str], bool]:
    """The keyword arguments ``module.forward`` names, and whether it takes ``**kwargs``."""
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return set(), False
    return set(params), any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _accepts(module: nn.Module, name: str) -> bool:
    names, var_keyword = _parameters(module)
    return var_keyword or name in names


def _cache_argument(module: nn.Module) -> str | None:
    """The name under which ``module.forward`` takes and returns its KV cache:
    ``past_key_values`` (Hugging Face 4.x, TinyCausalLM), ``cache`` (recent Hugging Face),
    or None when it cannot take one with ``position_ids`` and ``use_cache``."""
    names, var_keyword = _parameters(module)
    if not (var_keyword or {"position_ids", "use_cache"} <= names):
        return None
    if "past_key_values" in names:
        return "past_key_values"
    if "cache" in names:
        return "cache"
    return "past_key_values" if var_keyword else None


def _logits_of(out: Any) -> Tensor:
    if hasattr(out, "logits"):
        out = out.logits
    elif isinstance(out, (tuple, list)):
        out = out[0]
    if not isinstance(out, Tensor) or out.dim() != 3:
        raise InvalidRolloutError(
            f"the policy returned {type(out).__name__}; expected logits (B, L, vocab) or an object with .logits"
        )
    return out


class Model:
    """Next-token logits for every row, with or without the KV cache."""

    def __init__(self, policy: nn.Module, cache_argument: str | None, can_fall_back: bool) -> None:
        self.policy = policy
        self.cache_argument = cache_argument
        self.use_cache = cache_argument is not None
        self.can_fall_back = can_fall_back
        self.cache: Any = None
        self.fed = 0  # columns already in the cache
        self.pass_use_cache = _accepts(policy, "use_cache")

    def next_logits(self, seq: Sequences) -> Tensor:
        """(B, V) logits after each row's last real token."""
        if self.use_cache:
            return self._cached(seq)
        seq.shrink_width()
        width = seq.width
        kwargs: dict[str, Any] = {"use_cache": False} if self.pass_use_cache else {}
        logits = _logits_of(
            self.policy(input_ids=seq.ids[:, :width], attention_mask=seq.attention[:, :width], **kwargs)
        )
        if logits.shape[:2] != (seq.rows, width):
            raise InvalidRolloutError(
                f"policy logits have shape {tuple(logits.shape)}, expected ({seq.rows}, {width}, vocab)"
            )
        last = (seq.lengths - 1).clamp(min=0)
        return logits[torch.arange(seq.rows, device=logits.device), last]

    def _cached(self, seq: Sequences) -> Tensor:
        assert self.cache_argument is not None
        start, stop = self.fed, seq.width
        attended = seq.attention[:, :stop]
        if stop - start == 1:  # one column: each row's count of attended tokens, as the cumsum gives
            positions = (seq.lengths - 1).clamp(min=0)[:, None]
        else:
            positions = (attended.cumsum(1) - 1).clamp(min=0)[:, start:]
        out = self.policy(
            input_ids=seq.ids[:, start:stop],
            attention_mask=attended,
            position_ids=positions,
            use_cache=True,
            **{self.cache_argument: self.cache},
        )
        logits = _logits_of(out)
        n = stop - start
        if logits.shape[:2] != (seq.rows, n):
            raise InvalidRolloutError(
                f"policy logits have shape {tuple(logits.shape)}, expected ({seq.rows}, {n}, vocab)"
            )
        cache = getattr(out, self.cache_argument, None)
        if cache is None and isinstance(out, dict):
            cache = out.get(self.cache_argument)
        if cache is None:
            if not (self.can_fall_back and start == 0):
                raise InvalidRolloutError(
                    f"the policy returned no {self.cache_argument} with use_cache=True; call sample(..., use_cache=False)"
                )
            # Only the prompt was fed: its columns are already a right-padded layout.
            self.use_cache = False
            seq.compact = True
            seq.shrink_width()
        self.cache = cache
        self.fed = stop
        if n == 1:
            return logits[:, 0]
        columns = torch.arange(n, device=logits.device)
        last = torch.where(seq.real[:, start:stop], columns, -1).amax(1).clamp(min=0)
        return logits[torch.arange(seq.rows, device=logits.device), last]


def draw(
    logits: Tensor, sampling: Tensor, temperature: float, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """A token per row from softmax(logits / temperature) and its log-prob, computed as
    the learner does (``chosen - logsumexp``, fp32). One uniform per row, drawn on the
    generator's device: the same seed gives the same stream on CPU and CUDA."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logits = torch.where(sampling[:, None], logits, torch.zeros_like(logits))  # idle rows: anything finite
    log_z = torch.logsumexp(logits, dim=-1, keepdim=True)
    cdf = (logits - log_z).exp().cumsum(-1)
    draw_device = generator.device if generator is not None else logits.device
    u = torch.rand((logits.shape[0], 1), generator=generator, device=draw_device).to(logits.device)
    token = (cdf < u * cdf[:, -1:]).sum(-1).clamp(max=logits.shape[-1] - 1)
    log_prob = logits.gather(-1, token[:, None]).squeeze(-1) - log_z.squeeze(-1)
    return token, log_prob


def model_vocab(policy: nn.Module) -> int | None:
    get = getattr(policy, "get_input_embeddings", None)
    embeddings = get() if callable(get) else None
    size = getattr(embeddings, "num_embeddings", None)
    return int(size) if size is not None else None


def open_model(policy: nn.Module, use_cache: bool | str) -> Model:
    cache_argument = None if use_cache is False else _cache_argument(policy)
    if use_cache is True and cache_argument is None:
        raise InvalidOptionError(
            f"{type(policy).__name__}.forward takes no past_key_values (or cache), position_ids and use_cache; "
            "call sample(..., use_cache=False)"
        )
    return Model(policy, cache_argument, can_fall_back=use_cache == "auto")
