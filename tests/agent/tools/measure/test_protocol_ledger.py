"""The GPU-second ledger of agent/tools/measure/protocol.py: a run that loses samples reports one figure everywhere a person
reads it (the workstream's budget, its close-out and a campaign's budget), its lost rounds' GPU seconds included."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from kinv.agent.tools.measure.protocol import Ledger, Round, RoundLoop
from tests.agent.tools.backends.test_command_backend import _flaky_plan
from tests.utils import kinv_in_process, replay_env


class _Arm:
    def __init__(self, name: str, lose: set[int]):
        self.name, self.lose = name, lose

    def sample(self, level, round_index: int) -> dict:
        if round_index in self.lose:
            return {"us": None, "lost": "the command exited 4", "gpu_s": 0.5}
        return {"us": 100.0, "gpu_s": 1.0}


def test_the_round_loop_books_every_sample_it_takes_kept_or_lost():
    lv = SimpleNamespace(key="n1")
    arms = [_Arm("A", set()), _Arm("B", {1})]
    seen: list[Round] = []
    led = RoundLoop(arms, [lv], abba=True).run(range(3), seen.append)
    assert [r.order for r in seen] == [[0, 1], [1, 0], [0, 1]]  # ABBA
    assert seen[1].kept("n1") == {} and seen[1].lost("n1") == [1]  # a lost sample drops its level's round
    assert (led.gpu_s, led.kept, led.lost) == (5.5, 4, 1)  # the dropped partner's second is spent all the same
    shard = RoundLoop(arms, [lv], whole=False).run(range(3), lambda r: None)
    assert (shard.gpu_s, shard.kept, shard.lost) == (5.5, 5, 1)  # a screening keeps the partner's sample


def test_a_run_that_loses_samples_reports_the_same_gpu_seconds_in_its_budget_close_out_and_a_campaigns_budget(
        tmp_path):  # fmt: skip
    from kinv.agent.campaign.driver import Campaign
    from kinv.agent.store.db import Store
    from kinv.agent.workstream.context import open_checkpointer, run_config
    from kinv.agent.workstream.graph import build_graph

    env = replay_env(tmp_path, tmp_path / "state")
    r = kinv_in_process(env, "run", str(_flaky_plan(tmp_path, "1")), "--approval", "auto")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    store = Store(tmp_path / "state")
    lost = [e for e in store.events("#11a", limit=100_000) if e["kind"] == "sample.lost"]
    assert lost, "the flaky command lost no sample: nothing to check"
    kept = sum(s["gpu_s"] or 0.0 for e in store.experiments("#11a") for s in store.samples(e["id"]))

    budget = build_graph(None, open_checkpointer(store)).get_state(run_config("#11a", 1)).values["gpu_s"]
    text = (tmp_path / "state" / "reports" / "11a-closeout.md").read_text()
    close_out = float(re.search(r"in samples: ([0-9.]+) s", text).group(1))
    campaign, n = Campaign.spent(SimpleNamespace(store=store, ws_list=lambda: ["#11a"]))

    assert budget > kept  # the lost rounds' seconds are spent: the ledger counts them
    assert campaign == pytest.approx(budget, rel=1e-9)
    assert n == sum(store.sample_count(e["id"]) for e in store.experiments("#11a"))  # the samples it stored
    assert close_out == pytest.approx(budget, abs=0.006)  # the close-out prints two decimals
    assert Ledger.of(store, workstreams=["#11a"]).lost == len(lost)


def _loops_that_sample(text: str) -> list[int]:
    """Lines of ``for ... in range(...)`` loops whose body takes a sample (``x.sample(...)`` or a worker's
    ``request("sample", ...)``): a round loop written by hand."""
    import ast

    def samples(node) -> bool:
        for n in ast.walk(node):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
                if n.func.attr == "sample" or (
                    n.func.attr == "request"
                    and n.args
                    and isinstance(n.args[0], ast.Constant)
                    and n.args[0].value == "sample"
                ):
                    return True
        return False

    return [node.lineno for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.For) and isinstance(node.iter, ast.Call)
            and getattr(node.iter.func, "id", "") == "range" and any(samples(b) for b in node.body)]  # fmt: skip


def test_every_measurement_takes_its_rounds_through_the_one_round_loop():
    from pathlib import Path

    root = Path(__file__).resolve().parents[4]
    paths = sorted((root / "agent").rglob("*.py")) + [root / "benchmarks" / "record.py"]
    found = [f"{p.relative_to(root)}:{line}" for p in paths if p.name != "protocol.py"
             for line in _loops_that_sample(p.read_text())]  # fmt: skip
    assert found == [], f"a round loop outside agent/tools/measure/protocol.py's RoundLoop: {found}"
    old = "for r in range(rounds):\n    for lv in lvs:\n        smp = a.sample(lv, r)\n"
    assert _loops_that_sample(old) == [1]  # what the rule catches
