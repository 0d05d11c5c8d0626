"""Inputs that change between timed launches, and outputs judged on the inputs the launch that wrote them read.

The fill runs here in the Triton interpreter (on a GPU it runs inside the timed graph); the judge's side of it
(``JudgeOps.judge``) runs on the CPU exactly as the judge's process runs it.
"""

from __future__ import annotations

import torch

from kinv.agent.tools.worker import refresh, shared
from kinv.agent.tools.worker.judging import JudgeOps
from kinv.kernels.adapter import get_adapter

LEVEL = {"shape": "v4flash", "heads": 16, "page_size": 16, "context": 40, "batch": 2}


def _filled(seed, counter, step, n=4096, dtype=torch.float16, mean=0.0, sd=1.0):
    t = torch.empty(n, dtype=dtype)
    refresh.fill(t, refresh.counter("cpu", counter), seed, step, mean, sd)
    return t


def test_every_launch_and_every_replay_reads_new_values_that_the_judge_can_make_again():
    first = _filled(7, 0, 0)
    assert torch.equal(first, _filled(7, 0, 0))  # the same (seed, counter, step): the same values, anywhere
    # another launch of the same replay, the same launch of the next replay, another round: all new values
    for other in (_filled(7, 0, 1), _filled(7, 1, 0), _filled(8, 0, 0)):
        assert (other == first).float().mean() < 0.01
    x = first.float()
    assert abs(float(x.mean())) < 0.05 and abs(float(x.std()) - 1.0) < 0.05  # unit variance, as randn's
    shifted = _filled(7, 0, 0, mean=2.0, sd=0.5).float()
    assert abs(float(shifted.mean()) - 2.0) < 0.05 and abs(float(shifted.std()) - 0.5) < 0.05


def test_the_adapter_names_its_fresh_inputs_and_a_plugin_that_does_not_gets_its_smallest_float_input():
    mla = get_adapter("mla_decode")
    inputs = mla.make_inputs(mla.level(LEVEL), seed=1, device="cpu")
    assert mla.fresh_names(inputs) == ["q"]  # the decode step's queries, not the KV cache
    generic = type("Generic", (), {"fresh_inputs": ()})()
    pick = mla.__class__.fresh_names(generic, {"big": torch.zeros(1000), "small": torch.zeros(10),
                                               "ids": torch.zeros(5, dtype=torch.int32)})  # fmt: skip
    assert pick == ["small"]


def test_the_judge_passes_outputs_computed_on_the_refilled_inputs_and_refuses_outputs_of_the_inputs_before():
    adapter = get_adapter("mla_decode")
    level = adapter.level(LEVEL)
    base = adapter.make_inputs(level, seed=31, device="cpu")
    moments = {"q": refresh.moments(base["q"])}
    spec = {"seed": 31, "fill": {"names": ["q"], "seed": 1003, "counter": 5, "step": 2, "moments": moments}}
    read = refresh.refill(adapter.make_inputs(level, seed=31, device="cpu"), ["q"], spec["fill"])
    honest = adapter.reference(read).to(torch.bfloat16)  # what a kernel that did the work on those inputs wrote
    stale = adapter.reference(base).to(torch.bfloat16)  # what a kernel that remembered the last answer wrote
    judge = JudgeOps()
    ok = judge.judge({"kernel": "mla_decode", "level": LEVEL, "device": "cpu",
                      "saved": shared.save([honest], [spec])})  # fmt: skip
    assert ok["ok_all"] and ok["sets"] == 1
    bad = judge.judge({"kernel": "mla_decode", "level": LEVEL, "device": "cpu",
                       "saved": shared.save([stale], [spec])})  # fmt: skip
    assert not bad["ok_all"] and "input set 1 of 1" in bad["reason"]
    assert len(judge.kept_inputs) == 1  # the level's input set was made once and kept for its later checks


def test_outputs_handed_over_without_a_gpu_go_through_a_file_that_the_judge_removes():
    outs = [torch.arange(6.0).view(2, 3), (torch.ones(2), torch.zeros(1))]
    saved = shared.share(outs, [{"seed": 1}, {"seed": 2}])
    assert "file" in saved and "ipc" not in saved
    back = shared.load(saved)
    assert torch.equal(back[0], outs[0]) and torch.equal(back[1][0], outs[1][0])
    import os

    assert not os.path.exists(saved["file"])
