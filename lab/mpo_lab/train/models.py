"""Tiny causal language models for tests, benchmarks and toy experiments (needs torch).

- :class:`TinyCausalLM`: the project's own small causal transformer, with an optional KV
  cache, called like a Hugging Face causal LM.
- :func:`tiny_hf_model`: a tiny ``transformers`` model (Llama or GPT-2) built from a config,
  randomly initialised; nothing is downloaded (needs the ``hf`` extra).

Both work with :func:`mpo_lab.train.sampler.sample`, the learner and
:func:`mpo_rs.torch.critic.value_head_critic`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from mpo_rs.exceptions import InvalidOptionError, InvalidRolloutError

from .._deps import needs

__all__ = ["CausalLMOutput", "KVCache", "TinyCausalLM", "tiny_hf_model"]

PastKeyValues = tuple[tuple[Tensor, Tensor], ...]
"""One ``(keys, values)`` pair per layer, each ``(B, heads, L, head_width)``."""


class _KVStore:
    """Preallocated ``(B, heads, capacity, head_width)`` key and value buffers per layer
    (allocated at a layer's first write, with its dtype and device); the first ``filled``
    columns hold the cache."""

    def __init__(self, layers: int, capacity: int) -> None:
        self.keys: list[Tensor | None] = [None] * layers
        self.values: list[Tensor | None] = [None] * layers
        self.capacity = capacity
        self.filled = 0

    def write(self, layer: int, start: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Puts ``k``, ``v`` at columns ``start ..``; returns the columns ``0 ..`` up to them."""
        keys, values = self.keys[layer], self.values[layer]
        if keys is None or values is None:
            shape = (k.shape[0], k.shape[1], self.capacity, k.shape[3])
            keys, values = self.keys[layer], self.values[layer] = k.new_empty(shape), v.new_empty(shape)
        stop = start + k.shape[2]
        keys[:, :, start:stop] = k
        values[:, :, start:stop] = v
        return keys[:, :, :stop], values[:, :, :stop]


class KVCache(tuple):  # type: ignore[type-arg]  # a PastKeyValues tuple with the buffers they view
    """:class:`TinyCausalLM`'s KV cache without autograd: a plain tuple of one ``(keys,
    values)`` pair per layer, each ``(B, heads, length, head_width)`` (Hugging Face's legacy
    layout), whose tensors are views of preallocated buffers. A forward pass given the
    newest cache of its buffers writes its columns into them in place (reallocating at
    twice the size when full), so decoding does not copy the whole past at every token.
    A cache stays valid after later calls: extending an older one again (a branch)
    copies it into new buffers first."""

    _store: _KVStore
    length: int

    @classmethod
    def _view(cls, store: _KVStore, length: int) -> KVCache:
        pairs = []
        for k, v in zip(store.keys, store.values, strict=True):
            assert k is not None and v is not None
            pairs.append((k[:, :, :length], v[:, :, :length]))
        cache = super().__new__(cls, pairs)
        cache._store, cache.length = store, length
        return cache

    @staticmethod
    def _store_for(past: PastKeyValues | None, layers: int, past_len: int, total: int) -> _KVStore:
        """Buffers that hold ``past`` and room for ``total`` columns: ``past``'s own when it
        is their newest cache and they are large enough, else new ones with a copy of it."""
        store = past._store if isinstance(past, KVCache) else None
        if store is not None and store.filled == past_len and total <= store.capacity:
            return store
        new = _KVStore(layers, max(total, 2 * past_len, 64))
        if past is not None and past_len:
            for layer, (k, v) in enumerate(past):
                new.write(layer, 0, k, v)
        return new


@dataclass
class CausalLMOutput:
    """What :class:`TinyCausalLM` returns, shaped like a Hugging Face model output."""

    logits: Tensor
    """(B, L, out_features): next-token logits (or values, for a critic head)."""
    past_key_values: PastKeyValues | None = None
    """The cache over every position seen so far (only with ``use_cache=True``): a
    :class:`KVCache` when autograd is off, else a plain tuple of per-layer pairs."""
    hidden_states: Tensor | None = None
    """(B, L, width): the trunk's last hidden state (only with ``output_hidden_states=True``)."""


def _right_padded(attended: Tensor) -> bool:
    """Whether every row's attended positions come first, with no hole after a padding."""
    return not bool((attended[:, 1:] & ~attended[:, :-1]).any())


class _Block(nn.Module):
    """Pre-norm self-attention and MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.attn_out = nn.Linear(width, width)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(
        self, h: Tensor, allowed: Tensor | None, past: tuple[Tensor, Tensor] | None, store: _KVStore | None, layer: int
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """With ``store``, this call's keys and values go into its buffers after the
        ``past`` columns they hold; else they are concatenated to ``past``."""
        batch, length, width = h.shape
        # The layers' functions are called directly: the same operations as calling the
        # modules, without their per-call overhead (which one-token decoding pays per token).
        norm, mlp_in, mlp_out = self.attn_norm, cast(nn.Linear, self.mlp[0]), cast(nn.Linear, self.mlp[2])
        x = F.layer_norm(h, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
        qkv = F.linear(x, self.qkv.weight, self.qkv.bias)
        q, k, v = qkv.view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        if store is not None:
            k, v = store.write(layer, 0 if past is None else past[0].shape[2], k, v)
        elif past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=allowed is None)
        h = h + F.linear(a.transpose(1, 2).reshape(batch, length, width), self.attn_out.weight, self.attn_out.bias)
        norm = self.mlp_norm
        x = F.layer_norm(h, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
        return h + F.linear(F.gelu(F.linear(x, mlp_in.weight, mlp_in.bias)), mlp_out.weight, mlp_out.bias), (k, v)


class TinyCausalLM(nn.Module):
    """A small pre-norm causal transformer with learned absolute positions.

    Called as ``model(input_ids=..., attention_mask=..., position_ids=...,
    past_key_values=..., use_cache=...)`` and returning a :class:`CausalLMOutput`, like a
    Hugging Face causal LM. ``attention_mask`` ``(B, past + L)`` may have holes anywhere
    (left, right or in the middle): a masked position is never attended to by an attended
    one (outputs at masked positions are unspecified: a right-padded batch without a cache
    takes the causal kernel, whose padded rows differ). ``position_ids`` default to the number of attended tokens before each position, so
    a row gets the same positions however it is padded. The LM head is ``lm_head``
    (``get_output_embeddings``), so :func:`~mpo_rs.torch.critic.value_head_critic` can
    swap it for a scalar head. With ``use_cache=True`` and autograd off, the cache is a
    :class:`KVCache` in preallocated buffers (see there).
    """

    def __init__(self, vocab_size: int, width: int = 64, layers: int = 2, heads: int = 2, max_len: int = 2048) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("width", width), ("layers", layers), ("heads", heads),
                            ("max_len", max_len)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidOptionError(f"TinyCausalLM: `{name}` must be a positive integer, got {value!r}")
        if width % heads:
            raise InvalidOptionError(f"TinyCausalLM: `width` ({width}) must be a multiple of `heads` ({heads})")
        self.vocab_size, self.width, self.max_len = vocab_size, width, max_len
        self.embed = nn.Embedding(vocab_size, width)
        self.position = nn.Embedding(max_len, width)
        self.blocks = nn.ModuleList(_Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.lm_head: nn.Module = nn.Linear(width, vocab_size)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, head: nn.Module) -> None:
        self.lm_head = head

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        past_key_values: PastKeyValues | None = None,
        use_cache: bool = False,
        output_hidden_states: bool = False,
        **_: Any,
    ) -> CausalLMOutput:
        if input_ids.dim() != 2:
            raise InvalidRolloutError(f"TinyCausalLM: `input_ids` must be (B, L), got shape {tuple(input_ids.shape)}")
        batch, length = input_ids.shape
        past = 0 if past_key_values is None else past_key_values[0][0].shape[2]
        total = past + length
        device = input_ids.device
        if attention_mask is None:
            attended = torch.ones(batch, total, dtype=torch.bool, device=device)
        else:
            if attention_mask.shape != (batch, total):
                raise InvalidRolloutError(
                    f"TinyCausalLM: `attention_mask` has shape {tuple(attention_mask.shape)}, expected "
                    f"({batch}, {total}) (cached + new positions)"
                )
            attended = attention_mask.bool()
        if position_ids is None:
            position_ids = (attended.long().cumsum(1) - 1).clamp(min=0)[:, past:]
        if length and int(position_ids.max()) >= self.max_len:
            raise InvalidRolloutError(
                f"TinyCausalLM: position {int(position_ids.max())} is beyond max_len={self.max_len}; "
                "build the model with a larger max_len"
            )
        if length == 1:
            # One new column (decoding): it sees every attended key, and itself.
            allowed = attended.clone()
            allowed[:, -1] = True
            allowed = allowed[:, None, None, :]
        elif past == 0 and _right_padded(attended):
            # Right padding (every row's tokens first; the learner's layout): a real query's
            # keys are exactly the causal ones, so the kernel may skip the masked blocks. Real
            # positions get the same outputs and gradients, bit for bit; padded ones differ.
            allowed = None
        else:
            # Query i (absolute past + i) sees key j when j <= past + i and j is attended; it
            # always sees itself, so no row is empty (that would give NaN).
            query = torch.arange(past, total, device=device)[:, None]
            key = torch.arange(total, device=device)[None, :]
            allowed = ((key <= query)[None] & (attended[:, None, :] | (key == query)[None]))[:, None]
        h = self.embed(input_ids) + self.position(position_ids)
        # Without autograd the cache lives in preallocated buffers (KVCache); with it, the
        # past is concatenated, since writing in place would change tensors a graph saved.
        store = None
        if use_cache and not torch.is_grad_enabled():
            store = KVCache._store_for(past_key_values, len(self.blocks), past, total)
        cache = []
        for i, block in enumerate(self.blocks):
            h, kv = block(h, allowed, None if past_key_values is None else past_key_values[i], store, i)
            cache.append(kv)
        h = self.norm(h)
        new_cache: PastKeyValues | None = None
        if store is not None:
            store.filled = total
            new_cache = KVCache._view(store, total)
        elif use_cache:
            new_cache = tuple(cache)
        return CausalLMOutput(
            logits=self.lm_head(h),
            past_key_values=new_cache,
            hidden_states=h if output_hidden_states else None,
        )


def tiny_hf_model(
    vocab_size: int,
    *,
    kind: str = "llama",
    width: int = 64,
    layers: int = 2,
    heads: int = 2,
    max_len: int = 2048,
    attn_implementation: str | None = None,
) -> nn.Module:
    """A tiny randomly initialised ``transformers`` causal LM (``kind="llama"`` or
    ``"gpt2"``) built from a config; nothing is downloaded. Dropout is off, so sampling and
    the learner score tokens alike in train mode too. Seed with ``torch.manual_seed``."""
    with needs("mpo_lab.train.models.tiny_hf_model", "pip install 'mpo-lab[hf]'"):
        import transformers
    extra: dict[str, Any] = {}
    if attn_implementation is not None:
        extra["attn_implementation"] = attn_implementation
    if kind == "llama":
        llama_config = transformers.LlamaConfig(
            vocab_size=vocab_size, hidden_size=width, intermediate_size=4 * width, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max_len,
            attention_dropout=0.0, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
            pad_token_id=None, **extra,
        )  # fmt: skip
        return transformers.LlamaForCausalLM(llama_config)
    if kind == "gpt2":
        gpt2_config = transformers.GPT2Config(
            vocab_size=vocab_size, n_embd=width, n_layer=layers, n_head=heads, n_positions=max_len,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None, **extra,
        )  # fmt: skip
        return transformers.GPT2LMHeadModel(gpt2_config)
    raise InvalidOptionError(f"tiny_hf_model: unknown kind={kind!r}; expected 'llama' or 'gpt2'")
