"""Bad input, one case each (the fast lane; tests/agent/test_bad_plan.py, test_bad_config.py and test_bad_cli.py
generate them by the thousand).

Every refused command: exit 2, one ``kinv: `` line on stderr naming the bad value, no traceback, and nothing
created: the working directory's listing is the same before and after (no state dir, no kinv.db, no lock),
and the live config file is byte-identical.  The CLI runs in-process (``agent.cli.main``).
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

from kinv.agent.cli.app import main
from tests.utils import write_seed_config

ROOT = Path(__file__).resolve().parents[3]
PLAN = ROOT / "plans" / "3a-attention-occupancy.yaml"
BASE = yaml.safe_load(PLAN.read_text())


@pytest.fixture
def box(tmp_path, monkeypatch):
    """A working directory with a live config copy; KINV_STATE_DIR points at box/state (not created)."""
    (tmp_path / "configs").mkdir()
    write_seed_config(tmp_path / "configs")
    monkeypatch.setenv("KINV_CONFIG_DIR", str(tmp_path / "configs"))
    monkeypatch.setenv("KINV_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("KINV_FORCE_NO_GPU", "1")
    monkeypatch.delenv("KINV_DEBUG", raising=False)
    monkeypatch.delenv("TARGET_CTAS", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def listing(d: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() else None) for p in sorted(d.rglob("*"))}


def cli(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def refused(box: Path, argv, *needles, code: int = 2) -> str:
    before = listing(box)
    rc, out, err = cli(argv)
    what = f"argv={[str(a)[:100] for a in argv]!r} rc={rc} stderr={err[:2000]!r} stdout={out[-500:]!r}"
    assert "Traceback" not in out + err, what
    assert rc == code, what
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kinv: ") and len(lines[0]) <= 800, what
    assert lines[0].isprintable(), what
    for n in needles:
        assert n in lines[0], f"{n!r} not named: {what}"
    assert listing(box) == before, f"a refused command created or changed files: {what}"
    return lines[0]


def refused_at_load(box: Path, f: Path, *needles) -> str:
    """The plan is refused by load_plan itself (never run), and `kinv run` says so in one line."""
    from kinv.agent.errors import PlanError
    from kinv.agent.plan_file import load_plan

    with pytest.raises(PlanError):
        load_plan(f)
    return refused(box, ["run", f, "--backend", "replay", "--approval", "auto"], *needles)


def plan_file(box: Path, mutate) -> Path:
    import copy

    p = copy.deepcopy(BASE)
    mutate(p)
    f = box / "bad.yaml"
    f.write_text(yaml.safe_dump(p, sort_keys=False))
    return f


# --------------------------------------------------------------------------- #
# refused before the state dir is created
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("pid", ["-1", "0", "999999999", "12345678901234567890123"])
def test_env_bad_pid_creates_no_state(box, pid):
    refused(box, ["env", "--pid", pid, "--plan", PLAN], pid)


def test_bench_variant_without_recording_creates_no_state(box):
    refused(box, ["bench", "--plan", PLAN, "--backend", "replay", "--variant", "num_warps=1"], "replay has no",
            "BT16/BH16/w1/s2")
    (box / "configs" / "mla_decode.json").write_bytes((ROOT / "kernels" / "configs" / "mla_decode.json").read_bytes())
    refused(box, ["bench", "--plan", PLAN, "--backend", "replay", "--variant", "BLOCK_T=128"], "replay has no")


def test_run_level_without_recording_creates_no_state(box):
    f = plan_file(box, lambda p: p["workload"].update(levels=[1, 7]))
    refused(box, ["run", f, "--backend", "replay", "--approval", "auto"], "b7")


def test_run_target_ctas_without_recording_creates_no_state(box):
    f = plan_file(box, lambda p: p["environment"].update(TARGET_CTAS="333"))
    refused(box, ["run", f, "--backend", "replay", "--approval", "auto"], "TARGET_CTAS", "333")
    refused(box, ["bench", "--plan", f, "--backend", "replay"], "TARGET_CTAS", "333")
    refused(box, ["noise", "--plan", f, "--backend", "replay"], "TARGET_CTAS", "333")


def test_cuda_without_gpu_creates_no_state(box):
    for argv in (["run", PLAN, "--backend", "cuda", "--approval", "auto"], ["bench", "--plan", PLAN, "--backend", "cuda"],
                 ["noise", "--plan", PLAN, "--backend", "cuda"]):  # fmt: skip
        refused(box, argv, "--backend cuda", "replay")


@pytest.mark.parametrize("text,needle", [("garbage\n", "JSON"), (None, "num_warps=7")])
def test_run_with_bad_live_config_creates_no_state(box, text, needle):
    cfg = box / "configs" / "mla_decode.json"
    if text is None:
        d = json.loads(cfg.read_text())
        d["num_warps"] = 7
        text = json.dumps(d)
    cfg.write_text(text)
    refused(box, ["run", PLAN, "--backend", "replay", "--approval", "auto"], needle, "mla_decode.json")


# --------------------------------------------------------------------------- #
# plans refused at load time
# --------------------------------------------------------------------------- #
def _source_variant(p, path):
    p["variants"] = [dict(p["variants"][0], patch={}, source_patch=path)]


def test_plan_with_missing_source_patch_is_refused(box):
    f = plan_file(box, lambda p: _source_variant(p, "plans/patches/no-such.diff"))
    refused_at_load(box, f, "variants.V1.source_patch", "no-such.diff")


def test_plan_with_source_patch_that_is_not_a_diff_is_refused(box):
    (box / "plans").mkdir()
    (box / "plans" / "notes.diff").write_text("just some words\nno hunks here\n")
    f = plan_file(box, lambda p: _source_variant(p, "plans/notes.diff"))
    refused_at_load(box, f, "variants.V1.source_patch", "unified diff")


@pytest.mark.parametrize("where", ["workstream", "variant", "backlog"])
@pytest.mark.parametrize("ch", ["\x00", "\x1b", "\x07", "\n", "\u202e"])
def test_plan_title_with_control_character_is_refused(box, where, ch):
    def mutate(p):
        tgt = {"workstream": p["workstream"], "variant": p["variants"][0], "backlog": p["backlog"][0]}[where]
        tgt["title"] = "occupancy" + ch + "A/B"

    f = plan_file(box, mutate)
    refused_at_load(box, f, "title", "control character")


@pytest.mark.parametrize("heads,tp", [(1024, 1), (1024, 4), (512, 2)])
def test_plan_with_too_many_local_heads_is_refused(box, heads, tp):
    f = plan_file(box, lambda p: p["workload"]["model"].update(heads=heads, attention_tp=tp))
    refused_at_load(box, f, "workload.model", "128")


def test_local_heads_bound_is_the_adapters():
    from kinv.kernels.adapter import get_adapter

    a = get_adapter("mla_decode")
    assert a.max_local_heads == max(a.spec.tunable("BLOCK_H").values)
    w = a.workload_model().model_validate({"levels": [1], "model": {"heads": 1024, "attention_tp": 8}})
    assert [lv.heads for lv in a.levels(w)] == [128]


def test_variant_outside_the_plans_bounds_is_refused(box):
    f = plan_file(box, lambda p: p["variants"][0].update(patch={"num_warps": 16}))
    refused_at_load(box, f, "variants.V1.patch", "num_warps", "16",
            "bounds")
    f = plan_file(box, lambda p: p["variants"][2].update(patch={"overrides": [{"batch_max": 8, "num_warps": 2}]}))
    refused_at_load(box, f, "variants.V3.patch", "num_warps", "2")


# --------------------------------------------------------------------------- #
# ids and numbers
# --------------------------------------------------------------------------- #
def _some_state(box):
    from kinv.agent.store.db import Store

    s = Store(box / "state")
    s.upsert_workstream({"id": "#3a", "title": "t", "kernel": "mla_decode", "plan_path": str(PLAN), "status": "open"})
    s.conn.close()  # checkpointed: the listing a refused command must leave alone


@pytest.mark.parametrize("n", ["99999999999999999999999", "9223372036854775808", "0", "-5"])
def test_show_huge_experiment_id_is_bad_input(box, n):
    _some_state(box)
    refused(box, ["show", "--", n] if n.startswith("-") else ["show", n], n)
    refused(box, ["compare", "1", n] if not n.startswith("-") else ["compare", "--", "1", n], n)


@pytest.mark.parametrize("cmd", [["approve"], ["resume"], ["todos"], ["reject", "--reason", "no"], ["history"]])
def test_long_id_is_echoed_short(box, cmd):
    _some_state(box)
    line = refused(box, [*cmd, "a" * 100_000])
    assert len(line) < 300, line


@pytest.mark.parametrize("cmd", [["approve"], ["resume"], ["todos"], ["experiments"], ["history"]])
@pytest.mark.parametrize("ws", ["3a\n", " 3a", "3a\t", "3\x00a", "3a\x1b[2J"])
def test_id_with_whitespace_or_control_characters_is_refused(box, cmd, ws):
    _some_state(box)
    line = refused(box, [*cmd, ws], "id")
    assert "\\" in line or "whitespace" in line, line  # the value is shown escaped


def test_doctor_on_a_regular_file_is_bad_input(box):
    f = box / "afile"
    f.write_text("x")
    refused(box, ["doctor", "--state-dir", f], str(f), "file")
    refused(box, ["doctor", "--json", "--state-dir", f], str(f), "file")


def test_env_with_an_invalid_shell_value_is_bad_input(box, monkeypatch):
    monkeypatch.setenv("TARGET_CTAS", "abc")
    refused(box, ["env", "--plan", PLAN], "TARGET_CTAS", "abc")


def test_env_mismatch_says_so_on_stderr(box, monkeypatch):
    monkeypatch.setenv("TARGET_CTAS", "256")
    refused(box, ["env", "--plan", PLAN], "TARGET_CTAS", "256", "512", code=1)


def test_approve_without_state_is_bad_input(box):
    refused(box, ["approve", "3a-V1-2"], "no kinv state")


def test_empty_state_dir_variable_is_bad_input(box, monkeypatch):
    monkeypatch.setenv("KINV_STATE_DIR", "")
    refused(box, ["approve", "3a-V1-2"], "KINV_STATE_DIR")
    refused(box, ["status"], "KINV_STATE_DIR")


def test_missing_recordings_dir_is_bad_input(box, monkeypatch):
    monkeypatch.setenv("KINV_RECORDINGS", str(box / "nonexistent"))
    refused(box, ["bench", "--plan", PLAN, "--backend", "replay"], "nonexistent")
    refused(box, ["run", PLAN, "--backend", "replay", "--approval", "auto"], "nonexistent")


# --------------------------------------------------------------------------- #
# a bad value is never an internal error
# --------------------------------------------------------------------------- #
def test_an_unknown_todo_format_is_bad_input_naming_the_formats(box):
    _some_state(box)
    line = refused(box, ["todos", "3a", "--format", "jira"], "'jira'", "kinv, opencode, claude")
    assert "internal error" not in line


def test_an_unknown_mcp_client_is_bad_input_naming_the_clients(box):
    line = refused(box, ["mcp", "--print-config", "bogus"], "'bogus'", "claude or opencode")
    assert "internal error" not in line


@pytest.mark.parametrize("value", ["x", "3.5", "-1", "first"])
def test_a_bad_fault_point_variable_is_bad_input_and_creates_nothing(box, monkeypatch, value):
    """KINV_CRASH_AT must be a count: anything else is refused before the command starts (no state dir made)."""
    from kinv.agent import faults

    monkeypatch.setenv("KINV_CRASH_AT", value)
    faults.reset()
    try:
        line = refused(box, ["run", PLAN, "--backend", "replay", "--approval", "auto"], "KINV_CRASH_AT", repr(value))
        assert "internal error" not in line and "a count" in line
        assert not (box / "state").exists()
        monkeypatch.delenv("KINV_CRASH_AT")
        faults.reset()
        _some_state(box)
        monkeypatch.setenv("KINV_CRASH_AT", value)
        refused(box, ["status"], "KINV_CRASH_AT")
    finally:
        monkeypatch.delenv("KINV_CRASH_AT", raising=False)
        faults.reset()


# --------------------------------------------------------------------------- #
# bad input is a type of its own; a bug's ValueError is an internal error
# --------------------------------------------------------------------------- #
def test_a_bugs_value_error_is_an_internal_error(box, monkeypatch):
    from kinv.agent.report import views

    def boom(*a, **k):
        raise ValueError("an internal invariant broke")

    _some_state(box)
    monkeypatch.setattr(views, "status", boom)
    rc, out, err = cli(["status"])
    assert rc == 1, (rc, err)
    lines = err.splitlines()
    assert len(lines) == 1 and "internal error" in lines[0] and "ValueError" in lines[0], err
    log = Path(lines[0].rsplit("traceback in ", 1)[1])
    assert log.is_file() and "an internal invariant broke" in log.read_text() and "Traceback" in log.read_text()


def test_bad_input_is_a_type_of_its_own():
    from kinv.agent.errors import NoRecording, PlanError
    from kinv.kernels.errors import BadInput, ConfigError

    for cls in (PlanError, ConfigError, NoRecording):
        assert issubclass(cls, BadInput), cls
    assert not issubclass(ValueError, BadInput)


# --------------------------------------------------------------------------- #
# a variant the replay cannot measure: its reason, said once, with labels
# --------------------------------------------------------------------------- #
def test_no_recording_names_the_partner_config_not_its_hash():
    from kinv.agent.errors import NoRecording
    from kinv.agent.tools.backends.replay import ReplayBackend
    from kinv.kernels.launch_config import config_hash

    be = ReplayBackend()
    base = {"kernel": "mla_decode", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}
    var = {**base, "num_warps": 16}
    with pytest.raises(NoRecording) as exc:
        be.open("baseline", "mla_decode", base, {"TARGET_CTAS": "512"}, partner=var, role="base")
    assert "BT16/BH16/w16/s2" in str(exc.value) and config_hash(var) not in str(exc.value), exc.value


def test_finished_todo_reason_says_the_verdict_once():
    from kinv.agent.workstream.context import todo_reason

    assert todo_reason({"verdict": "not measured", "reason": "replay has no A/B"}) == "not measured: replay has no A/B"
    assert todo_reason({"verdict": "not measured", "reason": "not measured: replay has no A/B"}) == \
        "not measured: replay has no A/B"
    assert todo_reason({"verdict": "incorrect", "reason": "incorrect: max err 3"}) == "incorrect: max err 3"
