"""A kernel with more than one output (vLLM's MLA decode returns ``(out, lse)``): the worker allocates, poisons and
checks every one of them, not only the first."""

from __future__ import annotations

import torch

from kinv.agent.tools.worker import compare, shared


def test_every_output_of_a_tuple_is_allocated_per_input_set_and_poisoned():
    first = (torch.zeros(4, 8), torch.zeros(4, dtype=torch.float32))
    other = shared.empty_like(first)
    assert isinstance(other, tuple) and [t.shape for t in other] == [(4, 8), (4,)]
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(first, other, strict=True))
    compare._poison(other)
    assert all(torch.isnan(t).all() for t in other)  # a launch that writes no lse leaves NaN there


def test_a_wrong_second_output_fails_the_judgement(monkeypatch):
    from kinv.kernels.adapter import get_adapter

    a = get_adapter("moe_expert_gemm")
    ref = (torch.ones(4, 8), torch.ones(4))
    good = compare._clone(ref)
    bad = (ref[0].clone(), torch.full((4,), float("nan")))
    level = type("L", (), {"key": "k"})()
    monkeypatch.setattr(compare, "tolerance", lambda adapter, dtype, level, r: (1e-3, 1e-3, None))
    assert compare.judge(a, level, good, ref)["ok"]
    got = compare.judge(a, level, bad, ref)
    assert not got["ok"] and got["nonfinite"] == 4
