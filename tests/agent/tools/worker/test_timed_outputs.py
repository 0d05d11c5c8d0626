"""On a GPU: the outputs a sample's timed replays left are what is judged, on the inputs those replays read."""

from __future__ import annotations

import pytest

from kinv.agent.tools.backends import cuda
from kinv.agent.tools.worker.pool import WorkerPool
from kinv.kernels.adapter import get_adapter

LEVEL = {"shape": "v4flash", "heads": 16, "page_size": 64, "context": 1024, "batch": 4}
CFG = {"kernel": "mla_decode", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}


@pytest.mark.gpu
def test_each_sample_takes_out_its_fills_and_its_timed_outputs_pass_the_judge(monkeypatch):
    monkeypatch.setattr(cuda, "POOL", WorkerPool())
    be = cuda.CudaBackend()
    level = get_adapter("mla_decode").level(LEVEL)
    arm = be.open("A", "mla_decode", CFG, {})
    try:
        arm.setup(level)
        first = arm.sample(level, 0)  # the first sample's timed outputs are judged at once
        second = arm.sample(level, 1)
        assert arm.verify(level, "round 2")
        assert [why for _, why in arm.verified] == ["round 1 (its first timed sample)", "round 2"]
        for s in (first, second):
            assert 0 < s["refresh_us"] < s["us_raw"] and abs(s["us"] - (s["us_raw"] - s["refresh_us"])) < 1e-6
            assert s["launches"] == arm.setups[level.key]["launches_per_replay"]
        collected = arm.worker.request("collect", key=arm.setups[level.key]["key"], via="file")["check"]
        fills = [spec["fill"] for spec in collected["sets"]]
        assert all(f["names"] == ["q"] and f["seed"] == cuda.round_seed(1) for f in fills)
        assert len({f["step"] for f in fills}) == len(fills)  # each output's last writer is a launch of its own
    finally:
        arm.close()
        be.close()


@pytest.mark.gpu
def test_a_graph_that_copies_a_stale_answer_is_refused_on_its_timed_outputs(monkeypatch):
    """Outputs written before the fills (what a cache of earlier answers returns) fail the judge: the timed
    launches read queries no earlier launch read."""
    import torch

    monkeypatch.setattr(cuda, "POOL", WorkerPool())
    from kinv.agent.tools.worker import refresh, shared
    from kinv.agent.tools.worker.judging import JudgeOps

    adapter = get_adapter("mla_decode")
    level = adapter.level(LEVEL)
    base = adapter.make_inputs(level, seed=5)
    fill = {"names": ["q"], "seed": 77, "counter": 3, "step": 1, "moments": {"q": refresh.moments(base["q"])}}
    stale = adapter.reference(base).to(torch.bfloat16)
    got = JudgeOps().judge({"kernel": "mla_decode", "level": LEVEL,
                            "saved": shared.save([stale], [{"seed": 5, "fill": fill}])})  # fmt: skip
    assert not got["ok_all"]
