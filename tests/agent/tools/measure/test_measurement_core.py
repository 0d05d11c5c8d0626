"""The measurement core a variant cannot reach: one sequential A/B with every rule for every caller, the judge in a
process of its own, the code kinv relies on fingerprinted, the yardstick and the card's ceilings.

The GPU-only halves (a worker's timed captures checked on new inputs, its yardstick, a timer changed after set-up)
are drilled live by plans/6c-harness-drill.yaml (tests/agent/workstream/test_harness_drill.py, GPU lane).  Here, on the CPU:

* what a variant can do inside the process that launches it (change the timer's code in place, rebind the
  reference) is caught by the fingerprints and by the judge, which never imported it;
* ``kinv bench --variant`` and an adoption's confirming A/B go through the same sequential A/B as the graph: an
  incorrect candidate is refused before timing, an implausible win (faster than the copy bandwidth, or a yardstick
  faster than the card) is void, and a rule the path skipped is said;
* nothing but that module runs the round loop's A/B.
"""

from __future__ import annotations

import ast
import statistics
import sys
from pathlib import Path

import pytest
import torch

from kinv.agent.tools.backends.base import Arm, Backend
from kinv.agent.tools.worker import gate, judge, tamper
from kinv.kernels.mla_decode_adapter import MLADecodeAdapter

ROOT = Path(__file__).resolve().parents[4]
PLANTED = ROOT / "tests" / "fixtures" / "planted_plugin"
MLA = MLADecodeAdapter()
LEVEL = MLA.level({"shape": "v4flash", "heads": 16, "page_size": 64, "context": 4096, "batch": 1})
BASE = {"BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}


# --------------------------------------------------------------------------- #
# inside the launching process: fingerprints, and a judge elsewhere
# --------------------------------------------------------------------------- #
def test_a_timer_whose_code_is_changed_in_place_is_named_though_it_is_the_same_object():
    before = tamper.code_snapshot()
    fn = torch.cuda.Event.elapsed_time
    code = fn.__code__

    def fast(self, end_event):  # what a kernel module could swap in: the same function object, other code
        return 0.8 * super().elapsed_time(end_event)  # noqa

    try:
        fn.__code__ = fast.__code__.replace(co_freevars=code.co_freevars) if code.co_freevars else fast.__code__
        assert torch.cuda.Event.elapsed_time is fn  # an identity check sees nothing
        assert tamper.code_changed(before) == ["torch.cuda.Event.elapsed_time"]
    finally:
        fn.__code__ = code
    assert tamper.code_changed(before) == []


def test_a_function_kinv_calls_that_is_rebound_is_named(monkeypatch):
    before = tamper.code_snapshot()
    monkeypatch.setattr(statistics, "median", lambda xs: min(xs))  # the sample's median, quietly the minimum
    assert tamper.code_changed(before) == ["statistics.median"]


class RebindingAdapter(MLADecodeAdapter):
    """Fast and wrong (every output 10% low), and it rebinds the reference in its own process to agree with it."""

    def launch(self, inputs, params, out=None, scratch=None, **mode):
        import kinv.kernels.mla_decode_ref as ref

        o, compiled = super().launch(inputs, params, out=out, scratch=scratch, **mode)
        o.mul_(0.9)
        seen = o.clone()
        ref.mla_decode_reference = lambda *a, **k: seen.float()  # the judge in this process now agrees
        return o, compiled


def test_a_reference_rebound_in_memory_fools_a_judge_in_its_process_and_not_the_judge(monkeypatch):
    import kinv.kernels.mla_decode_ref as ref

    monkeypatch.setattr(ref, "mla_decode_reference", ref.mla_decode_reference)  # restored afterwards
    fooled = gate.check(RebindingAdapter(), BASE, [LEVEL], seed=3, device="cpu")
    assert fooled["ok"], "the planted trick should fool a judge that shares the kernel's process"
    monkeypatch.setattr(ref, "mla_decode_reference", ref.mla_decode_reference)
    deferred = gate.check(RebindingAdapter(), BASE, [LEVEL], seed=3, device="cpu", defer=True)
    assert deferred["levels"][0]["ok"] is None and "pending" in deferred["levels"][0]
    judged = judge.settle("mla_decode", deferred)  # a process that never imported the kernel under test
    assert not judged["ok"]
    assert "outside atol" in judged["reason"] or "relative error" in judged["reason"], judged["reason"]


def test_the_driver_judges_on_the_cpu_only_while_it_has_not_imported_the_kernel():
    import subprocess

    code = ("from kinv.agent.tools.worker import judge; from kinv.kernels.adapter import get_adapter; "
            "a = get_adapter('mla_decode'); print(judge.kernel_modules(a)); "
            "import kinv.kernels.mla_decode; print(judge.kernel_modules(a))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}).stdout.splitlines()  # fmt: skip
    assert out == ["[]", "['kinv.kernels.mla_decode']"], out


def test_an_honest_kernel_judged_by_the_judge_passes_as_it_does_in_its_own_process():
    here = gate.check(MLA, BASE, [LEVEL], seed=4, device="cpu")
    deferred = gate.check(MLA, BASE, [LEVEL], seed=4, device="cpu", defer=True)
    judged = judge.settle("mla_decode", deferred)
    assert here["ok"] and judged["ok"], judged["reason"]
    assert judged["levels"][0]["mismatched"] == here["levels"][0]["mismatched"] == 0
    assert judged["levels"][0]["rel_err"] == pytest.approx(here["levels"][0]["rel_err"], rel=1e-6)


# --------------------------------------------------------------------------- #
# every caller through one sequential A/B
# --------------------------------------------------------------------------- #
def test_nothing_but_the_sequential_module_runs_the_round_loops_ab():
    callers = []
    for path in sorted((ROOT / "agent").rglob("*.py")):
        if path.name in ("protocol.py", "sequential.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if name == "run_ab":
                    callers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert callers == [], f"the round loop's A/B is called outside agent/tools/measure/sequential.py: {callers}"


class PlantedArm(Arm):
    """Times a level of the planted kernel as a card of 3,000 GB/s would: the baseline at 60% of copy, the variant
    at ``variant_frac`` of it (above 1: faster than the card can move bytes), and a yardstick per sample."""

    def __init__(self, *a, speed: float, yard: float, **k):
        super().__init__(*a, **k)
        self.speed, self.yard = speed, yard
        self.fingerprint = {"gpu": "planted test card"}
        self.env_seen = {}

    def setup(self, level):
        self.setups[level.key] = {"level": level.key}
        return self.setups[level.key]

    def sample(self, level, round_index):
        from kinv.kernels.adapter import get_adapter

        bytes_ = get_adapter(self.kernel).bytes_moved(level)
        us = bytes_ / (3000e9 * self.speed) * 1e6 * (1 + 0.001 * ((round_index * 7 + len(self.name)) % 5))
        return {"us": us, "replays": 20, "gpu_s": us * 20e-6, "yard_gbps": self.yard}


class PlantedBackend(Backend):
    """A test's backend: what a variant that fools the timer would hand kinv (the gate still runs for real)."""

    name = "planted"
    loud = "planted backend: timings a test made up to fool the rules"
    variant_speed = 2.5  # the variant "moves" 2.5x the card's copy bandwidth
    variant_yard = 2900.0

    def open(self, name, kernel, config, env, replica=None, pythonpath=None, partner=None, role="variant",
             judge_path=None):  # fmt: skip
        base = role == "base"
        return PlantedArm(name=name, kernel=kernel, config=config, env=env, speed=0.6 if base else self.variant_speed,
                          yard=2900.0 if base else self.variant_yard)  # fmt: skip

    def ceilings(self):
        return {"copy_gbps": 3000.0, "yard_gbps": 2900.0, "matrix_tflops": {"bfloat16": 700.0}, "measured": True,
                "source": "the test's planted card"}  # fmt: skip

    def copy_bandwidth(self):
        return 3000.0


@pytest.fixture
def planted(monkeypatch, tmp_path):
    """The planted plugin importable here and in kinv's children, and the planted backend registered."""
    from kinv.agent.tools import backends

    monkeypatch.syspath_prepend(str(PLANTED))
    monkeypatch.setenv("PYTHONPATH", str(PLANTED))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KINV_FORCE_NO_GPU", "1")
    monkeypatch.setenv("KINV_CONFIG_DIR", str(tmp_path / "configs"))
    (tmp_path / "configs").mkdir()
    backends.register_backend("planted", PlantedBackend)
    yield PlantedBackend
    backends._REGISTRY.pop("planted", None)
    if "planted" in backends.BACKENDS:
        backends.BACKENDS.remove("planted")


def _bench(capsys, variant: str) -> dict:
    """``kinv bench --variant VARIANT --json`` of the planted plan on the planted backend (the command's own code;
    the CLI's --backend choices are fixed when it is imported)."""
    import io
    import json

    from rich.console import Console

    from kinv.agent.workstream.commands import bench_command

    capsys.readouterr()
    bench_command(str(PLANTED / "plan.yaml"), None, variant, "planted", 5, 6, None, True, Console(file=io.StringIO()))
    out = capsys.readouterr().out
    return json.loads(out[out.index("{"):])


@pytest.mark.slow
def test_bench_variant_voids_a_win_faster_than_the_card_can_move_bytes(planted, state_dir, capsys):
    r = _bench(capsys, "BLOCK=256")
    assert r["verdict"] == "void" and "faster than the roofline allows" in r["reason"], r
    assert "above the copy bandwidth (3,000 GB/s)" in r["reason"], r["reason"]
    assert any(s.startswith("A/A offsets") for s in r["skipped"])  # no A/A measured this pair: said, not hidden


@pytest.mark.slow
def test_bench_variant_voids_a_level_whose_yardstick_beat_the_card(planted, state_dir, monkeypatch, capsys):
    monkeypatch.setattr(PlantedBackend, "variant_speed", 0.62)  # a plausible time...
    monkeypatch.setattr(PlantedBackend, "variant_yard", 3600.0)  # ...read by a timer that runs 24% fast
    r = _bench(capsys, "BLOCK=256")
    assert r["verdict"] == "void" and "yardstick read 3,600 GB/s" in r["reason"], r


@pytest.mark.slow
def test_bench_variant_refuses_an_incorrect_candidate_before_timing(planted, state_dir, capsys):
    from kinv.agent.store.db import Store

    r = _bench(capsys, "SKIP_TAIL=1")
    assert r["verdict"] == "incorrect" and "not finite" in r["reason"], r
    store = Store(state_dir)
    exp = [e for e in store.experiments() if e["kind"] == "ab"][-1]
    assert exp["verdict"] == "incorrect" and store.sample_count(exp["id"]) == 0  # never timed


@pytest.mark.slow
def test_an_adoptions_confirming_ab_voids_an_implausible_win_and_refuses_an_incorrect_one(planted, state_dir):
    from kinv.agent.errors import AdoptError
    from kinv.agent.plan_file import load_plan
    from kinv.agent.store.db import Store
    from kinv.agent.workstream.adopt import confirm_against_live

    plan, _sha = load_plan(PLANTED / "plan.yaml")
    store = Store(state_dir, create=True)
    store.upsert_workstream({"id": "#90a", "title": "planted",
                             "kernel": plan.kernel, "status": "closed"})  # a closed workstream whose V1 it adopts
    live = {"BLOCK": 128, "SKIP_TAIL": 0}
    with pytest.raises(AdoptError, match="decided nothing: void: implausible timing"):
        confirm_against_live(store, "#90a", plan, "V1", {"BLOCK": 256, "SKIP_TAIL": 0}, live, "planted")
    with pytest.raises(AdoptError, match="decided nothing: incorrect"):
        confirm_against_live(store, "#90a", plan, "V2", {"BLOCK": 256, "SKIP_TAIL": 1}, live, "planted")
    assert not any(e["verdict"] == "accept" for e in store.experiments("#90a"))


def test_a_voided_variant_is_said_as_timed_and_voided_not_never_timed():
    from kinv.agent.report import summary

    v = summary.VariantVerdict("V1", "void", "void", note="implausible timing, faster than the roofline allows")
    s = summary.summarize([v], baseline="BT128", live="BT128", live_file="planted.json")
    assert "timed and voided" in s.outcome["V1"] and "never timed" not in s.outcome["V1"]
    assert "V1 was timed and voided" in repr(s)  # the sentence that lists what was not measured


def test_the_judges_are_stopped_with_the_run():
    judge.warm("cuda" if torch.cuda.is_available() else "cpu", [str(ROOT)])  # a judge of its own process
    procs = list(judge._JUDGES.values())
    assert procs and all(p.proc.poll() is None for p in procs)
    judge.close()
    assert all(p.proc.poll() is not None for p in procs)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
