"""Inputs that change between timed launches: a counter-based fill, run on the device inside the timed graph.

A kernel that remembers what it computed for inputs it has seen before returns right answers without doing the
work, if the timed launches read the same inputs replay after replay.  So before each timed launch the harness
writes new values into the inputs that change from step to step in real use (the adapter's
:attr:`~kinv.kernels.adapter.KernelAdapter.fresh_inputs`: the queries of a decode step, the activations of a
matmul) with one small kernel: element ``k`` of launch ``step`` in replay ``counter`` of a sample seeded ``seed``
gets ``mean + scale * u``, ``u`` uniform in [-sqrt(3), sqrt(3)) from an integer hash of the four.  The counter is
a one-element device tensor the graph itself increments at its end, so every replay of the same graph reads new
values, and no launch reads what an earlier one read.

The fill is pure integer arithmetic on the element's index, so the judge (a process that never imported the
variant) makes the very same values again from ``(seed, counter, step)`` and judges the outputs the timed replays
left on the inputs those replays read.  Its own time is measured in every sample by a graph of the fills alone
and taken out of the sample's time (``refresh_us``).

Imports: torch and triton only (the benchmark worker's rule).
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

FILL_BLOCK = 1024
UNIT_SPAN = math.sqrt(3.0)  # u uniform in [-sqrt(3), sqrt(3)): mean 0, variance 1


@triton.jit
def _mix(h):
    # lowbias32 (Wellons): a full-avalanche 32-bit integer hash
    h = h ^ (h >> 16)
    h = h * 0x7FEB352D
    h = h ^ (h >> 15)
    h = h * 0x846CA68B
    h = h ^ (h >> 16)
    return h


@triton.jit
def _fill_kernel(out_ptr, ctr_ptr, n, seed, step, mean, scale, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    ctr = tl.load(ctr_ptr).to(tl.uint32)
    h = offs.to(tl.uint32) ^ seed.to(tl.uint32)
    h = _mix(h + step.to(tl.uint32) * 0x9E3779B9)
    h = _mix(h + ctr * 0x85EBCA6B)
    u = (h >> 8).to(tl.float32) * (1.0 / 16777216.0)  # [0, 1), 24 bits: exact in float32
    v = mean + scale * (u * 2.0 - 1.0)
    tl.store(out_ptr + offs, v.to(out_ptr.dtype.element_ty), mask=mask)


def fill(t, ctr, seed: int, step: int, mean: float, scale: float) -> None:
    """Overwrite every element of the contiguous tensor ``t`` with the values of ``(seed, counter, step)``, the
    counter read on the device from the one-element int32 tensor ``ctr`` (so a captured graph reads it anew at
    every replay).  ``scale``: the half-width over sqrt(3) (the values' standard deviation)."""
    n = t.numel()
    if n == 0:
        return
    if not t.is_contiguous():
        raise ValueError(f"a fresh input must be contiguous to be refilled in place (shape {tuple(t.shape)})")
    grid = (triton.cdiv(n, FILL_BLOCK),)
    _fill_kernel[grid](t, ctr, n, int(seed) & 0x7FFFFFFF, int(step) & 0x7FFFFFFF, float(mean),
                       float(scale) * UNIT_SPAN, BLOCK=FILL_BLOCK)  # fmt: skip


def moments(t) -> tuple[float, float]:
    """``(mean, standard deviation)`` of a tensor's values: the fill keeps an input's scale (a softmax's inputs
    stay in the range its reference was written for)."""
    x = t.float()
    sd = float(x.std()) if x.numel() > 1 else 0.0
    return float(x.mean()), (sd if math.isfinite(sd) and sd > 0 else 1.0)


def counter(device, value: int = 0):
    """A one-element int32 counter on ``device``."""
    import torch

    return torch.full((1,), int(value), dtype=torch.int32, device=device)


def refill(inputs: dict, names, spec: dict) -> dict:
    """``inputs`` with each fresh input of ``names`` overwritten in place as the timed launch described by
    ``spec`` wrote it: ``{"seed", "counter", "step", "moments": {name: [mean, sd]}}`` (what the worker reports of
    the launch that last wrote an output).  The judge calls this on the input set made from its seed."""
    for name in names:
        t = inputs[name]
        mean, sd = spec["moments"][name]
        fill(t, counter(t.device, spec["counter"]), spec["seed"], spec["step"], mean, sd)
    return inputs


__all__ = ["FILL_BLOCK", "counter", "fill", "moments", "refill"]
