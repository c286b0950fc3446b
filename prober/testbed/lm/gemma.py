"""Gemma 3 (text) in plain torch, attending over KV pages the caller names.

Why not transformers' own forward: an engine decides which physical pages a request attends to, and the
fault this testbed exists for is decode attending over pages it did not write.  So keys and values live
in the engine's page tensors (keys stored after RoPE, at the positions they were computed for, as real
paged-attention engines store them), every request reads them through its page table, and positions and
masks are explicit: position = the slot's index in the page table; Gemma 3's sliding-window layers see
the last `sliding_window` positions, its full-attention layers everything up to the query.
tests/test_testbed_reallm.py checks the logits against transformers' forward.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor
from torch.nn import functional as F


@dataclass(frozen=True)
class GemmaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    sliding: tuple[bool, ...]  # per layer: a sliding-window layer (else full attention)
    sliding_window: int
    rope_theta_full: float
    rope_theta_sliding: float
    rms_eps: float
    query_scale: float
    attn_softcap: float | None
    final_softcap: float | None

    @property
    def num_layers(self) -> int:
        return len(self.sliding)

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, data: dict[str, Any]) -> GemmaConfig:
        """From a transformers `config.json` of model_type gemma3_text."""
        if data.get("model_type") != "gemma3_text":
            raise ValueError(f"not a Gemma 3 text model: model_type {data.get('model_type')!r}")
        rope = data.get("rope_parameters") or {}
        activation = data.get("hidden_activation", "gelu_pytorch_tanh")
        if activation != "gelu_pytorch_tanh":
            raise ValueError(f"unsupported activation {activation!r}")
        return cls(
            vocab_size=int(data["vocab_size"]), hidden_size=int(data["hidden_size"]),
            intermediate_size=int(data["intermediate_size"]), num_heads=int(data["num_attention_heads"]),
            num_kv_heads=int(data["num_key_value_heads"]), head_dim=int(data["head_dim"]),
            sliding=tuple(kind == "sliding_attention" for kind in data["layer_types"]),
            sliding_window=int(data["sliding_window"]),
            rope_theta_full=float(rope.get("full_attention", {}).get("rope_theta", data.get("rope_theta", 1e6))),
            rope_theta_sliding=float(rope.get("sliding_attention", {}).get("rope_theta",
                                                                           data.get("rope_local_base_freq", 1e4))),
            rms_eps=float(data["rms_norm_eps"]), query_scale=float(data["query_pre_attn_scalar"]) ** -0.5,
            attn_softcap=data.get("attn_logit_softcapping"), final_softcap=data.get("final_logit_softcapping"),
        )


class PagedKV:
    """One pool's keys and values: [layer, slot, kv_dim] with slot = page * page_size + offset.

    Zeros until written, never cleared on free: what an earlier request left stays readable.
    """

    def __init__(self, config: GemmaConfig, num_pages: int, page_size: int) -> None:
        self.page_size = page_size
        shape = (config.num_layers, num_pages * page_size, config.kv_dim)
        self.k = torch.zeros(shape, dtype=torch.float32)
        self.v = torch.zeros(shape, dtype=torch.float32)

    def slots(self, pages: Sequence[int]) -> Tensor:
        """Physical slots of a page table, in logical order."""
        base = torch.as_tensor(list(pages), dtype=torch.long)[:, None] * self.page_size
        return (base + torch.arange(self.page_size)).reshape(-1)

    def copy(self, source: PagedKV, source_pages: Sequence[int], pages: Sequence[int], num_tokens: int) -> None:
        """The first num_tokens positions of one page table into another (the prefill -> decode hand-off)."""
        if num_tokens <= 0:
            return
        src = source.slots(source_pages)[:num_tokens]
        dst = self.slots(pages)[:num_tokens]
        self.k[:, dst] = source.k[:, src]
        self.v[:, dst] = source.v[:, src]


class RequestKV:
    """A request's view of its page table: the first `length` positions are attended as they are (its own
    entries, or whatever stale ones the table points at); new tokens are appended at `length`, into both a
    private contiguous copy (gathered once, so a decode step reads no page index) and the pages themselves."""

    def __init__(self, store: PagedKV, pages: Sequence[int], length: int, *, write_through: bool = True) -> None:
        self.store = store
        self.write_through = write_through  # False: an experiment that must leave the pages as it found them
        self.slots = store.slots(pages)
        if not 0 <= length <= len(self.slots):
            raise ValueError(f"length {length} outside a page table of {len(self.slots)} slots")
        self.length = length
        self.k = store.k[:, self.slots]
        self.v = store.v[:, self.slots]

    @property
    def capacity(self) -> int:
        return len(self.slots)

    def append(self, layer: int, k: Tensor, v: Tensor) -> None:
        """K/V [T, kv_dim] of the next T positions of one layer."""
        end = self.length + k.shape[0]
        self.k[layer, self.length : end] = k
        self.v[layer, self.length : end] = v
        if not self.write_through:
            return
        where = self.slots[self.length : end]
        self.store.k[layer, where] = k
        self.store.v[layer, where] = v


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight)


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Gemma:
    """Weights and the forward pass.  Inference only; one call at a time (the engine holds a lock)."""

    def __init__(self, config: GemmaConfig, weights: dict[str, Tensor]) -> None:
        self.config = config
        self.w = weights
        self.embed = weights["model.embed_tokens.weight"]
        self.embed_scale = torch.tensor(config.hidden_size**0.5, dtype=torch.float32)
        dims = torch.arange(0, config.head_dim, 2, dtype=torch.float32) / config.head_dim
        self.inv_freq = {True: 1.0 / (config.rope_theta_sliding**dims), False: 1.0 / (config.rope_theta_full**dims)}

    @classmethod
    def load(cls, folder: Path) -> Gemma:
        config = GemmaConfig.from_hf(json.loads((folder / "config.json").read_text()))
        return cls(config, load_file(str(folder / "model.safetensors")))

    def _layer(self, i: int, name: str) -> Tensor:
        return self.w[f"model.layers.{i}.{name}.weight"]

    def _rope(self, positions: Tensor, sliding: bool) -> tuple[Tensor, Tensor]:
        freqs = positions[:, None].float() * self.inv_freq[sliding]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    @torch.inference_mode()
    def forward(self, ids: Tensor, kv: RequestKV, *, all_logits: bool = False) -> Tensor:
        """Run ids [T] at positions kv.length.. (appending their K/V); logits of the last position [vocab],
        or of every position [T, vocab]."""
        return self.forward_batch([(ids, kv)], all_logits=all_logits)[0]

    @torch.inference_mode()
    def forward_batch(self, batch: Sequence[tuple[Tensor, RequestKV]], *, all_logits: bool = False) -> list[Tensor]:
        """Several sequences in one pass, each over its own page table.  Projections and MLPs run on all their
        rows at once -- one read of the weights, which is most of what a decode step costs on a CPU."""
        cfg = self.config
        spans: list[tuple[int, int]] = []
        for ids, kv in batch:
            if kv.length + len(ids) > kv.capacity:
                raise ValueError(f"{kv.length + len(ids)} positions do not fit a page table of {kv.capacity}")
            spans.append((kv.length, kv.length + len(ids)))
        positions = torch.cat([torch.arange(a, b) for a, b in spans])
        h = F.embedding(torch.cat([ids for ids, _ in batch]), self.embed) * self.embed_scale
        ropes = {sliding: self._rope(positions, sliding) for sliding in set(cfg.sliding)}
        kvs = [kv for _, kv in batch]
        for i, sliding in enumerate(cfg.sliding):
            residual = h
            x = _rms_norm(h, self._layer(i, "input_layernorm"), cfg.rms_eps)
            h = residual + _rms_norm(self._attention(i, x, kvs, spans, ropes[sliding], sliding),
                                     self._layer(i, "post_attention_layernorm"), cfg.rms_eps)
            residual = h
            x = _rms_norm(h, self._layer(i, "pre_feedforward_layernorm"), cfg.rms_eps)
            gate = F.gelu(F.linear(x, self._layer(i, "mlp.gate_proj")), approximate="tanh")
            x = F.linear(gate * F.linear(x, self._layer(i, "mlp.up_proj")), self._layer(i, "mlp.down_proj"))
            h = residual + _rms_norm(x, self._layer(i, "post_feedforward_layernorm"), cfg.rms_eps)
        for kv, (_, end) in zip(kvs, spans, strict=True):
            kv.length = end
        rows = torch.cumsum(torch.tensor([b - a for a, b in spans]), 0)
        if not all_logits:
            h = h[rows - 1]
        logits = F.linear(_rms_norm(h, self.w["model.norm.weight"], cfg.rms_eps), self.embed)
        if cfg.final_softcap:
            logits = torch.tanh(logits / cfg.final_softcap) * cfg.final_softcap
        if not all_logits:
            return list(logits)
        return list(torch.tensor_split(logits, rows[:-1].tolist()))

    def _attention(self, i: int, x: Tensor, kvs: list[RequestKV], spans: list[tuple[int, int]],
                   rope: tuple[Tensor, Tensor], sliding: bool) -> Tensor:
        cfg = self.config
        rows, d = x.shape[0], cfg.head_dim
        q = F.linear(x, self._layer(i, "self_attn.q_proj")).view(rows, cfg.num_heads, d)
        k = F.linear(x, self._layer(i, "self_attn.k_proj")).view(rows, cfg.num_kv_heads, d)
        v = F.linear(x, self._layer(i, "self_attn.v_proj")).view(rows, cfg.num_kv_heads, d)
        q = _rms_norm(q, self._layer(i, "self_attn.q_norm"), cfg.rms_eps)
        k = _rms_norm(k, self._layer(i, "self_attn.k_norm"), cfg.rms_eps)
        cos, sin = rope[0][:, None, :], rope[1][:, None, :]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        out = []
        row = 0
        for kv, (start, end) in zip(kvs, spans, strict=True):
            count = end - start
            mine = slice(row, row + count)
            row += count
            kv.append(i, k[mine].reshape(count, -1), v[mine].reshape(count, -1))
            out.append(self._attend(i, q[mine], kv, start, end, sliding))
        return F.linear(torch.cat(out), self._layer(i, "self_attn.o_proj"))

    def _attend(self, i: int, q: Tensor, kv: RequestKV, start: int, end: int, sliding: bool) -> Tensor:
        """Queries at positions start..end-1 over the page table's positions they may see."""
        cfg = self.config
        d, count = cfg.head_dim, end - start
        low = max(0, start - cfg.sliding_window + 1) if sliding else 0
        group = cfg.num_heads // cfg.num_kv_heads
        keys = kv.k[i, low:end].view(-1, cfg.num_kv_heads, d).transpose(0, 1).repeat_interleave(group, dim=0)
        values = kv.v[i, low:end].view(-1, cfg.num_kv_heads, d).transpose(0, 1).repeat_interleave(group, dim=0)
        mask = None
        if count > 1:  # one query needs no mask: `low` already is its window
            key_pos = torch.arange(low, end)[None, :]
            query_pos = torch.arange(start, end)[:, None]
            mask = key_pos <= query_pos
            if sliding:
                mask &= key_pos > query_pos - cfg.sliding_window
        queries = q.transpose(0, 1)
        if cfg.attn_softcap:
            scores = queries @ keys.transpose(1, 2) * cfg.query_scale
            scores = torch.tanh(scores / cfg.attn_softcap) * cfg.attn_softcap
            if mask is not None:
                scores = scores.masked_fill(~mask, -math.inf)
            out = torch.softmax(scores, dim=-1) @ values
        else:
            out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=cfg.query_scale)
        return out.transpose(0, 1).reshape(count, -1)
