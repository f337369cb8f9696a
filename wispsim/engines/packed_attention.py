"""Packed attention for the HF engine: one sequence of new tokens, attention per request.

vLLM runs a batch *packed*: the new tokens of all requests go through the projections, MLPs and
LM head as one sequence, and attention is computed per request over its own cached prefix and new
tokens, so the attention work is sum L_total x L_new, not that of a padded batch. This module
gives transformers the same: :func:`register_packed_attention` registers :func:`packed_attention`
as the attention implementation ``wispsim_packed``, and the engine sets the current batch's
:class:`PackedLayout` around each forward pass. ``loop`` runs PyTorch SDPA once per request (any
device); ``varlen`` (CUDA only) runs one variable-length flash-attention call per layer.
Sliding-window layers (Mistral, gpt-oss, Qwen's windowed layers: transformers passes
``sliding_window``) see only their window of keys; attention sinks (gpt-oss's ``s_aux``: one logit
per head in every softmax's denominator) are applied in ``loop`` and refused by ``varlen``, which
has no such argument. torch and transformers are imported when these functions run, never at
import.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np

from wispsim.errors import WispsimError

ATTN_NAME = "wispsim_packed"


class PackedLayout:
    """Where each request's queries and keys sit in a packed forward pass.

    The KV cache holds the packed prefixes (``past`` tokens: request 0's prefix, request 1's,
    ...); the forward's new tokens are packed after them in the same order. Request i's queries
    are new tokens [q0, q0 + L_new); its keys are its prefix [c0, c0 + L_cached) followed by its
    new tokens [past + q0, past + q0 + L_new), causal within the new tokens.
    """

    def __init__(self, l_new: Sequence[int], l_cached: Sequence[int], past: int, device: Any) -> None:
        import torch

        self.segments: list[tuple[int, int, int, int, int]] = []
        self.masks: dict[int, Any] = {}
        q0 = c0 = 0
        gather: list[Any] = []
        for i, (n, c) in enumerate(zip(l_new, l_cached, strict=True)):
            self.segments.append((q0, n, c0, c, past + q0))
            if n > 1 and c > 0:  # query j (0-based) sees the prefix and new tokens 0..j
                self.masks[i] = torch.ones(n, c + n, dtype=torch.bool, device=device).tril(diagonal=c)
            gather += [torch.arange(c0, c0 + c), torch.arange(past + q0, past + q0 + n)]
            q0 += n
            c0 += c
        self.n_new = q0
        self._gather = torch.cat(gather).to(device) if gather else None
        totals = [n + c for n, c in zip(l_new, l_cached, strict=True)]
        self.cu_q = torch.tensor([0, *np.cumsum(l_new)], dtype=torch.int32, device=device)
        self.cu_k = torch.tensor([0, *np.cumsum(totals)], dtype=torch.int32, device=device)
        self.max_q = max(l_new, default=0)
        self.max_k = max(totals, default=0)


# the layout and method of the forward pass running now (set by the engine around each pass)
_LAYOUT: list[PackedLayout | None] = [None]
_METHOD: list[str] = ["loop"]


@functools.cache
def _varlen_kwargs(fn: Any) -> frozenset[str]:
    """The keyword arguments this torch's ``varlen_attn`` takes."""
    return frozenset(inspect.signature(fn).parameters)


def packed_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers attention function: query (1, H, N_new, D), key/value (1, KV, past + N_new, D);
    returns (1, N_new, H, D)."""
    import torch
    import torch.nn.functional as F

    layout = _LAYOUT[0]
    if layout is None or query.shape[0] != 1 or query.shape[2] != layout.n_new:
        raise RuntimeError(
            "wispsim_packed attention needs a packed batch (see packed_attention.PackedLayout)"
        )
    gqa = query.shape[1] != key.shape[1]
    window, sinks = kwargs.get("sliding_window"), kwargs.get("s_aux")
    if _METHOD[0] == "varlen":
        from torch.nn.attention.varlen import varlen_attn

        q = query[0].transpose(0, 1).contiguous()
        k = key[0].transpose(0, 1).index_select(0, layout._gather)
        v = value[0].transpose(0, 1).index_select(0, layout._gather)
        # torch's varlen API grew between releases: causal is ``window_size=(-1, 0)`` from 2.12
        # (``is_causal`` before; both align the diagonal bottom-right, after the cached prefix),
        # and grouped KV heads are ``enable_gqa`` from 2.12 (repeated by hand before)
        accepts = _varlen_kwargs(varlen_attn)
        kw: dict[str, Any] = {"scale": scaling}
        if sinks is not None or (window and "window_size" not in accepts):
            what = "attention sinks" if sinks is not None else "sliding windows (torch >= 2.12 has them)"
            raise WispsimError(f"--attention varlen cannot apply this model's {what}: use --attention loop")
        left = window - 1 if window else -1
        kw.update({"window_size": (left, 0)} if "window_size" in accepts else {"is_causal": True})
        if gqa and "enable_gqa" in accepts:
            kw["enable_gqa"] = True
        elif gqa:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        out: Any = varlen_attn(q, k, v, layout.cu_q, layout.cu_k, layout.max_q, layout.max_k, **kw)
        return out.unsqueeze(0), None
    out = query.new_empty(1, query.shape[2], query.shape[1], query.shape[3])
    for i, (q0, n, c0, c, k0) in enumerate(layout.segments):
        q = query[:, :, q0 : q0 + n]
        k = key[:, :, k0 : k0 + n]
        v = value[:, :, k0 : k0 + n]
        if c:
            k = torch.cat([key[:, :, c0 : c0 + c], k], dim=2)
            v = torch.cat([value[:, :, c0 : c0 + c], v], dim=2)
        mask, causal = layout.masks.get(i), c == 0 and n > 1
        if window or sinks is not None:
            mask, causal = _mask(n, c, window, sinks, query), False
            if sinks is not None:  # a zero key and value whose logit is the head's sink
                k = torch.cat([k, k.new_zeros(*k.shape[:2], 1, k.shape[3])], dim=2)
                v = torch.cat([v, v.new_zeros(*v.shape[:2], 1, v.shape[3])], dim=2)
        o = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, scale=scaling, enable_gqa=gqa
        )
        out[:, q0 : q0 + n] = o.transpose(1, 2)
    return out, None


def _mask(n: int, c: int, window: int | None, sinks: Any, query: Any) -> Any:
    """An additive mask for ``n`` queries after ``c`` cached keys: causal, within ``window`` keys
    when given, and a last column holding each head's sink logit when ``sinks`` is given."""
    import torch

    rows = torch.arange(n, device=query.device).unsqueeze(1) + c  # each query's absolute position
    cols = torch.arange(c + n, device=query.device).unsqueeze(0)
    seen = cols <= rows
    if window:
        seen &= cols > rows - window
    bias = torch.zeros(seen.shape, dtype=query.dtype, device=query.device).masked_fill(~seen, float("-inf"))
    if sinks is None:
        return bias
    heads = query.shape[1]
    sink = sinks.to(query.dtype).reshape(heads, 1, 1).expand(heads, n, 1)
    return torch.cat([bias.expand(heads, n, c + n), sink], dim=2).unsqueeze(0)


def register_packed_attention() -> None:
    """Make ``wispsim_packed`` a transformers attention implementation (once)."""
    from transformers import AttentionInterface

    if ATTN_NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTN_NAME, packed_attention)
