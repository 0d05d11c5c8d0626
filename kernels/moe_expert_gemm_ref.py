"""The float32 torch reference of the MoE expert GEMM (kernels/moe_expert_gemm.py).

Kept in its own file, like ``mla_decode_ref.py``: it is what every variant is
judged against, so a source patch to the kernel never touches it.
"""

from __future__ import annotations

import torch


def moe_expert_gemm_reference(x: torch.Tensor, w: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """``out[t, j, :] = x[t, :] @ w[topk_ids[t, j]].T`` in float32, one expert at a time.

    Shapes: ``x [T, K]``, ``w [E, N, K]``, ``topk_ids [T, top_k]`` -> ``[T, top_k, N]`` float32.
    Expert by expert (not one big gather of ``w``) so that large shapes
    (T 96, top_k 8, N 4096, K 7168) fit in memory.
    """
    tokens, top_k = topk_ids.shape
    n = w.shape[1]
    xf = x.float()
    ids = topk_ids.long()
    out = torch.empty((tokens, top_k, n), dtype=torch.float32, device=x.device)
    for e in torch.unique(ids).tolist():
        t_idx, j_idx = (ids == e).nonzero(as_tuple=True)
        out[t_idx, j_idx] = xf[t_idx] @ w[e].float().T
    return out
