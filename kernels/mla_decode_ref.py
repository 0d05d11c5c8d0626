"""The float32 torch reference of the MLA decode kernel (kernels/mla_decode.py).

Kept in its own file: it is what every variant is judged against, so a source
patch to the kernel never touches it, and kinv hashes it (with the metric
definitions) to void any verdict whose run changed it.
"""

from __future__ import annotations

import math

import torch


def mla_decode_reference(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    d_v: int = 512,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """Plain softmax attention in float32, one request at a time, no splits."""
    batch, num_heads, d_qk = q.shape
    page_size = kv_cache.shape[1]
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(d_qk)
    rows = kv_cache.reshape(-1, d_qk).float()
    out = torch.empty((batch, num_heads, d_v), dtype=torch.float32, device=q.device)
    lens = seq_lens.tolist()
    for b in range(batch):
        n = lens[b]
        t = torch.arange(n, device=q.device)
        row_ids = block_table[b, t // page_size].long() * page_size + t % page_size
        kv = rows[row_ids]  # [n, d_qk]
        scores = (q[b].float() @ kv.T) * sm_scale  # [H, n]
        out[b] = torch.softmax(scores, dim=-1) @ kv[:, :d_v]
    return out
