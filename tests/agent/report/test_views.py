"""The read path of the inspection CLI: agent/report/views.py.

The store is filled by benchmarks/demo_store.py's ``populate_demo`` (the seed's #3a investigation: noise, V1
and V2 rejected, V3 moot), the one the benchmark of `kinv status` fills with 50 experiments and 10,000 samples.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.demo_store import LEVELS, V1_DIFF, populate_demo
from kinv.agent.errors import NotFound
from kinv.agent.report import todo_export, views
from kinv.agent.report.view_models import ShowView, StatusView, TodoView
from kinv.agent.store.db import Store

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def store(state_dir):
    s = Store(state_dir)
    yield s
    s.close()


@pytest.fixture
def demo(store):
    return populate_demo(store, n_experiments=3, n_samples=300)


# --------------------------------------------------------------------------- #
# status, todos, experiments, pending, backups
# --------------------------------------------------------------------------- #
def test_status_shape_and_contents(store, demo):
    view = views.status(store)
    assert view.state_dir == str(store.dir)
    assert [w.id for w in view.workstreams] == ["#3a", "#3b"]
    ws = view.workstreams[0]
    assert ws.parent == "#3" and ws.kernel == "mla_decode" and ws.backend == "replay"
    assert ws.recommendation.startswith("OEA")
    assert [t.id for t in ws.todos] == ["#3a.noise", "#3a.V1", "#3a.V2", "#3a.V3"]
    v3 = ws.todos[3]
    assert (v3.status, v3.reason, v3.parent) == ("cancelled", "moot: V1 regressed at every level", "#3a.V1")
    assert ws.pending_approvals == []  # #3a's approval was decided
    latest = {v.variant: (v.verdict, v.experiment) for v in ws.latest_verdicts}
    assert latest == {
        "noise": ("equivalent", demo["by_variant"]["noise"][-1]),
        "V1": ("reject", demo["by_variant"]["V1"][-1]),
        "V2": ("reject", demo["by_variant"]["V2"][-1]),
    }
    ws_b = view.workstreams[1]
    assert [a.id for a in ws_b.pending_approvals] == ["ap-3b-T32"]
    assert ws_b.pending_approvals[0].resources == {"smem_bytes": 98304, "fits": True}
    assert ws_b.latest_verdicts == []


def test_status_json_round_trip(store, demo):
    view = views.status(store)
    text = view.model_dump_json()
    assert StatusView.model_validate_json(text) == view
    data = json.loads(views.dump_json(view))
    assert set(data) == {"state_dir", "campaigns", "workstreams", "adhoc"}
    assert set(data["workstreams"][0]["todos"][0]) == set(TodoView.model_fields)


def test_latest_verdict_is_the_newest_experiment(store):
    ids = populate_demo(store, n_experiments=6, n_samples=60)["by_variant"]
    store.update_experiment(ids["V1"][-1], verdict="inconclusive", reason="budget spent")
    latest = {v.variant: v for v in views.status(store).workstreams[0].latest_verdicts}
    assert (latest["V1"].verdict, latest["V1"].experiment) == ("inconclusive", ids["V1"][-1])


def test_empty_store(store):
    assert views.status(store).workstreams == []
    assert views.pending(store) == [] and views.backups(store) == [] and views.experiments(store) == []


def test_todos_in_order(store, demo):
    got = views.todos(store, "3a")
    assert [t.id for t in got] == ["#3a.noise", "#3a.V1", "#3a.V2", "#3a.V3"]
    assert [t.position for t in got] == [0, 1, 2, 3]
    assert views.todos(store, "#3b")[0].content == "Test BLOCK_T 32 with num_stages 1"


def test_experiments_count_samples(store):
    demo = populate_demo(store, n_experiments=5, n_samples=503)
    exps = views.experiments(store, "#3a")
    assert [e.id for e in exps] == demo["experiments"]
    assert sum(e.samples for e in exps) == 503
    assert exps[0].kind == "noise" and exps[1].variant == "V1" and exps[1].verdict == "reject"
    assert views.experiments(store, "3b") == []
    assert len(views.experiments(store)) == 5


def test_pending_and_backups(store, demo):
    pend = views.pending(store)
    assert [(a.id, a.workstream, a.status) for a in pend] == [("ap-3b-T32", "#3b", "pending")]
    assert "BLOCK_T" in pend[0].diff and pend[0].hypothesis
    bks = views.backups(store)
    assert [b.id for b in bks] == demo["backups"]
    assert bks[0].path == "kernels/configs/mla_decode.json" and bks[0].sha == "abc123" and bks[0].workstream == "#3a"
    assert json.loads(views.dump_json(bks))[1]["backup_path"] == "state/backups/2-mla_decode.json"


# --------------------------------------------------------------------------- #
# id resolution
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("given", ["3a", "#3a", " 3a "])
def test_resolve_ws_accepts_both_spellings(store, demo, given):
    assert views.resolve_ws(store, given) == "#3a"


def test_unknown_workstream_names_the_known_ones(store, demo):
    with pytest.raises(NotFound, match=r"^unknown workstream '#9z'; known: #3a, #3b$"):
        views.resolve_ws(store, "9z")
    with pytest.raises(ValueError, match="known: #3a, #3b"):  # NotFound is a ValueError
        views.todos(store, "#9z")


def test_unknown_workstream_in_an_empty_store(store):
    with pytest.raises(NotFound, match="no workstreams yet"):
        views.resolve_ws(store, "3a")


def test_unknown_experiment_lists_ids(store):
    populate_demo(store, n_experiments=7, n_samples=70)
    with pytest.raises(NotFound, match=r"^unknown experiment 42; experiments: 1-7$"):
        views.show(store, 42)
    with pytest.raises(NotFound, match="give a number"):
        views.show(store, "V1")
    assert views._ranges([1, 2, 3, 5, 8, 9]) == "1-3, 5, 8-9"


def test_unknown_approval_lists_pending(store, demo):
    with pytest.raises(NotFound, match=r"^unknown approval 'nope'; pending: ap-3b-T32$"):
        views.approval(store, "nope")
    assert views.approval(store, "ap-3a-V2").status == "approved"


# --------------------------------------------------------------------------- #
# show
# --------------------------------------------------------------------------- #
def test_show_summarizes_samples_per_level_and_arm(store, demo):
    v1 = demo["by_variant"]["V1"][0]
    view = views.show(store, str(v1))
    assert view.experiment.id == v1 and view.experiment.variant == "V1" and view.experiment.samples == 100
    assert [(s.level, s.arm) for s in view.sample_summary] == [(lv, arm) for lv in LEVELS for arm in ("A", "B")]
    assert all(s.n == 10 for s in view.sample_summary)
    raw = [s["us"] for s in store.samples(v1) if s["level"] == LEVELS[0] and s["arm"] == "B"]
    b1 = view.sample_summary[1]
    assert (b1.min_us, b1.max_us) == (min(raw), max(raw)) and b1.min_us <= b1.median_us <= b1.max_us
    assert 0 < b1.cv < 0.2
    assert b1.median_us > view.sample_summary[0].median_us  # V1 is slower at b1
    assert [e.level for e in view.effects] == LEVELS
    assert all(e.variant == "V1" and e.verdict == "regressed" and e.ratio < 1 for e in view.effects[:2])
    assert view.diff == V1_DIFF
    assert view.correctness["ok"] is True and view.resources["smem_bytes"] == 61440
    assert view.env_checks[0]["ok"] is True and view.env_checks[0]["seen"] == {"TARGET_CTAS": "512"}
    assert view.ledger.samples == 100 and view.ledger.rounds == 10
    assert view.ledger.gpu_s == pytest.approx(0.2)
    assert ShowView.model_validate_json(view.model_dump_json()) == view


def test_show_noise_experiment(store, demo):
    view = views.show(store, demo["by_variant"]["noise"][0])
    assert view.effects == [] and view.correctness is None
    assert [n.level for n in view.noise] == LEVELS and all(n.equivalent for n in view.noise)


# --------------------------------------------------------------------------- #
# todo exports
# --------------------------------------------------------------------------- #
def test_export_opencode(store, demo):
    got = todo_export.to_opencode(views.todos(store, "#3a"))
    assert [t["status"] for t in got] == ["completed", "completed", "completed", "cancelled"]
    assert [t["priority"] for t in got] == ["high", "high", "medium", "low"]
    assert set(got[0]) == {"id", "content", "status", "priority"}
    assert got[3]["id"] == "#3a.V3"
    assert todo_export.export_todos(store.todos("#3b"), "opencode")[0]["status"] == "pending"


def test_export_claude(store, demo):
    store.upsert_todo({"id": "#3a.V1", "status": "in_progress"})
    got = todo_export.to_claude(views.todos(store, "#3a"))
    assert all(set(t) == {"content", "status", "activeForm"} for t in got)
    assert {t["status"] for t in got} <= {"pending", "in_progress", "completed"}
    assert [t["status"] for t in got] == ["completed", "in_progress", "completed", "completed"]
    assert got[0]["activeForm"] == "Measuring the noise band (A/A)"  # the stored active_form
    assert got[1]["activeForm"] == "Testing V1: num_warps 8"  # derived
    assert (
        got[3]["content"]
        == "[cancelled: moot: V1 regressed at every level] V3: batch-aware warps (4 at batch <= 8, 8 above)"
    )


@pytest.mark.parametrize("content, expected", [
    ("Measure the noise band", "Measuring the noise band"), ("Run the A/B", "Running the A/B"),
    ("Write the close-out", "Writing the close-out"), ("Try BLOCK_T 32", "Trying BLOCK_T 32"),
    ("Test V2", "Testing V2"), ("V2: num_stages 3", "Testing V2: num_stages 3"),
])  # fmt: skip
def test_active_form(content, expected):
    assert todo_export.active_form(content) == expected


def test_export_unknown_format(store, demo):
    with pytest.raises(ValueError, match="valid: kinv, opencode, claude"):
        todo_export.export_todos([], "jira")


# --------------------------------------------------------------------------- #
# history: kinv.db's node runs
# --------------------------------------------------------------------------- #
def test_history_lists_every_node_run_of_a_closed_run_in_order_with_its_decision(tmp_path, state_dir, closed_3a):
    """kinv history reads kinv.db's node runs (no LangGraph tables) of a closed replay run of #3a, in order,
    each with what it decided."""
    from tests.utils import kinv_in_process, replay_env

    env = replay_env(tmp_path, state_dir)
    items = json.loads(kinv_in_process(env, "history", "3a", "--json").stdout)
    assert [i["node"] for i in items[:5]] == ["setup", "baseline", "noise", "pick", "design"]
    assert [i["step"] for i in items] == list(range(1, len(items) + 1))
    assert items[3]["outcome"] == "-> design" and items[3]["decision"] == "next: V1"
    assert "paused" not in {i["outcome"] for i in items}  # --approval auto: nothing waited
    assert items[-1]["node"] == "closeout"
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ", i["time"]) for i in items)
    text = kinv_in_process({**env, "COLUMNS": "80"}, "history", "3a").stdout
    assert "closeout" in text and "setup" in text


@pytest.mark.slow
def test_history_lists_every_node_run_with_its_decision_and_a_pause_for_approval(tmp_path, state_dir):
    """A real replay run of #3a, paused at V1's approval: kinv history reads kinv.db's node runs (no LangGraph
    tables), in order, each with what it decided; the pause names the approval; resuming appends, in order."""
    from tests.utils import kinv_in_process as run_kinv
    from tests.utils import replay_env

    env = replay_env(tmp_path, state_dir)
    assert run_kinv(env, "run", "plans/3a-attention-occupancy.yaml", "--backend", "replay", "--approval",
                    "ask").returncode == 3  # fmt: skip
    items = json.loads(run_kinv(env, "history", "3a", "--json").stdout)
    assert [i["node"] for i in items] == ["setup", "baseline", "noise", "pick", "design", "approval"]
    assert [i["step"] for i in items] == [1, 2, 3, 4, 5, 6]
    assert items[3]["outcome"] == "-> design" and items[3]["decision"] == "next: V1"
    approval = json.loads(run_kinv(env, "pending", "--json").stdout)[0]["id"]
    assert items[-1]["outcome"] == "paused" and items[-1]["decision"] == f"waiting for approval {approval}"
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ", i["time"]) for i in items)
    assert run_kinv(env, "approve", approval).returncode == 0
    assert run_kinv(env, "resume", "3a").returncode in (0, 3)
    after = json.loads(run_kinv(env, "history", "3a", "--json").stdout)
    assert after[:6] == items and after[6]["node"] == "approval" and after[6]["outcome"] != "paused"
    text = run_kinv({**env, "COLUMNS": "80"}, "history", "3a").stdout
    assert "waiting for approval" in text and "setup" in text


def test_history_of_a_workstream_that_never_ran_and_of_an_unknown_one(store, demo):
    assert views.history(store, "#3a") == []
    with pytest.raises(NotFound):
        views.history(store, "#9z")


# --------------------------------------------------------------------------- #
# imports
# --------------------------------------------------------------------------- #
def test_views_import_no_heavy_modules():
    code = ("import sys, agent.report.views; heavy = [m for m in ('torch', 'triton', 'langgraph', 'rich', 'scipy')"
            " if m in sys.modules]; print(','.join(heavy))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert out.stdout.strip() == ""


def test_kinv_status_imports_only_what_it_shows(state_dir, demo):
    """`kinv status` renders a tree and tables: no syntax highlighter (pygments), no YAML, no LangGraph, no
    kernel launch configs (no campaign to describe), no sample statistics (status shows none)."""
    code = ("import sys, io, contextlib\nfrom kinv.agent.cli import app\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    code = app.main(['status'])\n"
            "print(code, sorted(m for m in sys.modules if m.split('.')[0] in ('pygments', 'yaml', 'langgraph', 'torch',"
            " 'triton', 'statistics', 'sqlite_utils') or m in ('rich.syntax', 'kinv.kernels.launch_config')))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "KINV_STATE_DIR": str(state_dir)})  # fmt: skip
    assert out.stdout.strip() == "0 []"


def test_every_table_reads_at_80_columns_with_the_varying_part_of_the_level_in_each_row(tmp_path, state_dir, closed_3a):
    """Piped with COLUMNS=80, a row still says which level it is (b1, b8, ...: the common part of the key is
    in the title), nothing is cut (a pipe gets whole lines, however wide: tests/agent/cli/test_terminal.py has the
    80-column terminal), and progress is plain lines, not carriage returns."""
    from tests.utils import kinv_in_process as run_kinv
    from tests.utils import replay_env

    env = replay_env(tmp_path, state_dir, COLUMNS="80")
    assert "\r" not in closed_3a and "[V1] round 1/" in closed_3a  # the run, piped: one plain line per round
    outs = {cmd: run_kinv(env, *cmd.split()) for cmd in ("status", "experiments 3a", "todos 3a", "show 3",
                                                         "noise --backend replay --rounds 4")}  # fmt: skip
    for cmd, o in outs.items():
        assert o.returncode == 0, (cmd, o.stderr)
        # piped: no line is cut with an ellipsis, whatever COLUMNS says
        assert "…" not in o.stdout, (cmd, o.stdout)
    for cmd in ("show 3", "noise --backend replay --rounds 4"):
        rows = [ln.split()[0] for ln in outs[cmd].stdout.splitlines() if ln.strip().startswith("b")]
        assert {"b1", "b8", "b32", "b64", "b96"} <= set(rows), (cmd, outs[cmd].stdout)
        assert "v4flash/h16/p64/ctx4096/*" in outs[cmd].stdout  # the common part, once, in the title
    # the ad-hoc A/A (kinv noise) is listed by status, outside any workstream
    st = json.loads(run_kinv(env, "status", "--json").stdout)
    assert [e["kind"] for e in st["adhoc"]] == ["noise"] and st["adhoc"][0]["samples"] > 0
    # reasons name levels by what varies
    exps = {e["variant"]: e for e in json.loads(run_kinv(env, "experiments", "3a", "--json").stdout)}
    assert exps["V1"]["reason"].startswith("reject: regressed at b1 (") or "regressed at b1 (" in exps["V1"]["reason"]


def test_report_env_and_todo_exports_give_json_of_the_same_content(tmp_path, state_dir, closed_3a):
    """`report --json` carries every experiment's per-level change (the number the close-out prints) and the
    Markdown; `env --json` says what was expected and seen; todo exports come wrapped as {"todos": [...]}."""
    from tests.utils import kinv_in_process as run_kinv
    from tests.utils import replay_env

    env = replay_env(tmp_path, state_dir)
    rep = json.loads(run_kinv(env, "report", "3a", "--json").stdout)
    v1 = next(e for e in rep["experiments"] if e["experiment"]["variant"] == "V1")
    b1 = next(e for e in v1["effects"] if e["level"].endswith("/b1"))
    assert f"{b1['change']:+.2%}" in rep["markdown"]  # the JSON and the close-out give the same number
    assert math.isclose(b1["change"], math.expm1(b1["effect"])) and b1["change_low"] < b1["change"] < b1["change_high"]
    assert rep["workstream"]["id"] == "#3a" and rep["close_out"].endswith("3a-closeout.md")
    e = json.loads(run_kinv({**env, "TARGET_CTAS": "256"}, "env", "--plan", "plans/3a-attention-occupancy.yaml",
                            "--json").stdout)
    assert e == {"source": "shell", "expected": {"TARGET_CTAS": "512"}, "seen": {"TARGET_CTAS": "256"}, "ok": False,
                 "mismatch": ["TARGET_CTAS"]}  # fmt: skip
    for fmt in ("opencode", "claude"):
        todos = json.loads(run_kinv(env, "todos", "3a", "--format", fmt).stdout)
        assert list(todos) == ["todos"] and {t["content"] for t in todos["todos"]} >= {"V1: num_warps 8"}


def test_sample_summaries_never_pool_times_from_two_gpus():
    """A screening on Ray has an incumbent arm on each GPU: `kinv show` keeps them apart, one row per GPU."""
    from kinv.agent.report.views import summarize_samples

    rows = [{"level": "b1", "arm": "I", "us": 10.0, "place": "actor0@n/gpu0"},
            {"level": "b1", "arm": "I", "us": 10.1, "place": "actor0@n/gpu0"},
            {"level": "b1", "arm": "I", "us": 10.6, "place": "actor1@n/gpu1"}]  # fmt: skip
    got = summarize_samples(rows)
    assert [(s.place, s.n, s.median_us) for s in got] == [("actor0@n/gpu0", 2, 10.05), ("actor1@n/gpu1", 1, 10.6)]
    assert summarize_samples([{"level": "b1", "arm": "A", "us": 1.0}])[0].place is None  # one process: no place
