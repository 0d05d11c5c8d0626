"""The live file is the baseline of record for every write: what kinv shows a person is the diff from the live
file's exact bytes to the exact bytes it writes, and its way back restores the shipped bytes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.utils import kinv_in_process, leave_kinv_patch_live, replay_env, run_kinv

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = (ROOT / "kernels" / "configs" / "mla_decode.json").read_bytes()


def _store(tmp_path):
    from kinv.agent.store.db import Store

    return Store(tmp_path / "state", create=True)


def _changed_lines(diff: str) -> tuple[list[str], list[str]]:
    lines = diff.splitlines()
    return ([ln for ln in lines if ln.startswith("-") and not ln.startswith("---")],
            [ln for ln in lines if ln.startswith("+") and not ln.startswith("+++")])  # fmt: skip


def test_a_one_value_patch_changes_one_line_and_keeps_the_files_own_order_indent_and_description(tmp_path):
    from kinv.agent.tools.files import config_text, configs

    live = {"num_stages": 2, "BLOCK_H": 16, "kernel": "mla_decode", "BLOCK_T": 16, "num_warps": 4,
            "description": "kept by hand, last on purpose: é"}  # fmt: skip
    path = tmp_path / "mla_decode.json"
    path.write_text(json.dumps(live, indent=4, ensure_ascii=False))  # no trailing newline, indent 4
    before = path.read_text()
    row = configs.patch_config(_store(tmp_path), path, {**live, "num_warps": 8}, "#t")
    after = path.read_text()
    assert after == before.replace('"num_warps": 4', '"num_warps": 8')  # one line, nothing else
    assert _changed_lines(row["diff"]) == (['-    "num_warps": 4,'], ['+    "num_warps": 8,'])
    assert config_text.apply_unified_diff(before, row["diff"], path) == after


def test_a_variant_measured_against_another_baseline_is_written_as_the_minimal_edit_of_the_live_file(tmp_path):
    from kinv.agent.plan_file import load_plan
    from kinv.agent.tools.files import config_text, configs
    from kinv.kernels.launch_config import config_hash, load_config

    plan, _ = load_plan(ROOT / "plans" / "3a-attention-occupancy.yaml")
    measured = plan.variant_config(plan.variant("V1"))  # what gate and measure run: the file as patched
    path = tmp_path / "mla_decode.json"
    path.write_bytes(SHIPPED)
    row = configs.patch_config(_store(tmp_path), path, measured, "#3a")
    written = path.read_bytes()
    assert config_hash(load_config(path)) == config_hash(measured)  # the kernel runs exactly what is measured
    assert config_text.apply_unified_diff(SHIPPED.decode(), row["diff"], path).encode() == written
    old, new = json.loads(SHIPPED), json.loads(written)
    assert new["description"] == old["description"]  # a temporary patch keeps the file's description
    assert [k for k in new] == [k for k in old if k in new]  # the file's own key order
    assert "overrides" not in new  # the measured config has none: each live override would change a level
    removed, added = _changed_lines(row["diff"])
    assert '+  "num_warps": 8,' in added and '+  "BLOCK_T": 16,' in added and '+  "CTAS_PER_SM": 0' in added
    assert not any("BLOCK_H" in ln or "num_stages" in ln or "description" in ln for ln in removed + added)


def test_writing_a_config_over_a_file_keeps_the_files_own_key_order(tmp_path):
    from kinv.agent.tools.files import configs

    path = tmp_path / "mla_decode.json"
    path.write_text('{"num_warps": 4, "kernel": "mla_decode", "BLOCK_T": 16, "BLOCK_H": 16, "num_stages": 2}')
    configs.write_config(path, {"kernel": "mla_decode", "BLOCK_T": 32, "BLOCK_H": 16, "num_warps": 4,
                                "num_stages": 2})  # fmt: skip
    assert path.read_text() == '{"num_warps": 4, "kernel": "mla_decode", "BLOCK_T": 32, "BLOCK_H": 16, "num_stages": 2}'
    assert not hasattr(configs, "CONFIG_KEY_ORDER")  # no kinv order for a file kinv does not own


def test_no_tracked_file_is_a_lock_file():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    bad = [f for f in tracked.splitlines() if f.endswith(".kinv-lock") or "kinv-tmp-" in f]
    assert not bad, f"tracked lock or temp files: {bad}"
    ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", "kernels/configs/.x.kinv-lock"], cwd=ROOT)
    assert ignored.returncode == 0  # a lock file never shows up as a change to commit


def _small_3a(tmp_path) -> Path:
    """#3a at two batch levels and a short A/A (the same baseline, variants and bounds)."""
    plan = tmp_path / "3a.yaml"
    text = (ROOT / "plans" / "3a-attention-occupancy.yaml").read_text()
    text = text.replace("levels: [1, 8, 32, 64, 96]", "levels: [1, 8]").replace("aa_rounds: 16", "aa_rounds: 8")
    plan.write_text(text.replace("quick_rounds: 8", "quick_rounds: 4").replace("max_rounds: 32", "max_rounds: 8"))
    return plan


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


@pytest.mark.slow
def test_an_approval_shows_the_diff_from_the_live_bytes_to_exactly_the_bytes_written(tmp_path, state_dir):
    env = replay_env(tmp_path, state_dir)
    live = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    live.write_bytes(SHIPPED)  # the shipped file: description, overrides, CTAS_PER_SM
    plan = _small_3a(tmp_path)
    r = run_kinv(env, "run", plan, "--backend", "replay", "--approval", "ask")
    assert r.returncode == 3, r.stdout + r.stderr
    item = json.loads(run_kinv(env, "pending", "--json").stdout)[0]
    from kinv.agent.tools.files import config_text
    from kinv.agent.tools.files.durable import sha_bytes

    note = [ln for ln in item["diff"].splitlines() if ln.startswith("note:")]
    assert len(note) == 1 and "BT16/BH16/w4/s2" in note[0] and "BT64/BH16/w4/s2/cps2" in note[0], item["diff"]
    removed, added = _changed_lines(item["diff"])
    assert '+  "BLOCK_T": 16,' in added and not any("description" in ln for ln in removed + added)
    promised = config_text.apply_unified_diff(SHIPPED.decode(), item["diff"], live).encode()  # applies to the live bytes
    assert live.read_bytes() == SHIPPED  # the run pauses before writing anything
    assert run_kinv(env, "approve", item["id"]).returncode == 0
    proc = subprocess.Popen([os.sys.executable, "-m", "kinv.agent.cli.app", "resume", "3a", "--backend", "replay"],
                            env={**env, "KINV_STOP_AT": "patch.replaced"}, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.time() + 120
        while not _stopped(proc.pid) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert _stopped(proc.pid), "the resumed run never wrote the variant"
        written = live.read_bytes()  # the live file while V1 is patched
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 3, out  # V2 waits for its own approval; V1 was measured and reverted
    assert written == promised  # what was written is what was approved, byte for byte
    from kinv.agent.store.db import Store

    row = next(p for p in Store(state_dir).patches("#3a") if p["kind"] == "config")
    assert row["sha_after"] == sha_bytes(written) and row["diff"] in item["diff"]
    assert live.read_bytes() == SHIPPED  # byte-identical after the run


def _leave_variant_live(cfg: Path, tmp_path) -> None:
    """What a killed run whose kinv.db was then lost leaves behind: kinv's V1 patch (#3a's measured V1)."""
    from kinv.agent.plan_file import load_plan

    plan, _ = load_plan(ROOT / "plans" / "3a-attention-occupancy.yaml")
    leave_kinv_patch_live(cfg, plan.variant_config(plan.variant("V1")))


def test_revert_to_plan_restores_the_shipped_bytes_not_the_plans_measurement_baseline(tmp_path, state_dir):
    env = replay_env(tmp_path, state_dir)
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    cfg.write_bytes(SHIPPED)  # untracked here: kinv keeps the bytes of record before its first write
    _leave_variant_live(cfg, tmp_path)
    assert cfg.read_bytes() != SHIPPED
    r = kinv_in_process(env, "revert", "--to-plan", "plans/3a-attention-occupancy.yaml")
    assert r.returncode == 0 and "file of record" in r.stdout and "kept" in r.stdout, r.stdout + r.stderr
    assert cfg.read_bytes() == SHIPPED  # the shipped file, not the seed's BT16
    assert not Path(state_dir).exists()  # it needed (and wrote) no state
    again = kinv_in_process(env, "revert", "--to-plan", "plans/3a-attention-occupancy.yaml")
    assert again.returncode == 0 and "already holds its file of record" in again.stdout
    # the plan's measurement baseline, only when asked for by name; the shipped bytes stay the way back
    r = kinv_in_process(env, "revert", "--to-plan-baseline", "plans/3a-attention-occupancy.yaml")
    assert r.returncode == 0 and "measurement baseline of #3a" in r.stdout and "not the shipped" in r.stdout
    assert json.loads(cfg.read_text())["BLOCK_T"] == 16
    assert kinv_in_process(env, "revert", "--to-plan", "plans/3a-attention-occupancy.yaml").returncode == 0
    assert cfg.read_bytes() == SHIPPED


def test_revert_to_plan_restores_git_heads_bytes_of_a_tracked_config(tmp_path, state_dir):
    env = replay_env(tmp_path, state_dir)
    cfg_dir = Path(env["KINV_CONFIG_DIR"])
    cfg = cfg_dir / "mla_decode.json"
    cfg.write_bytes(SHIPPED)
    git = ["git", "-C", str(cfg_dir), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "mla_decode.json"], check=True)
    subprocess.run(git + ["commit", "-qm", "shipped"], check=True)
    cfg.write_text(cfg.read_text().replace('"num_warps": 4', '"num_warps": 8'))  # whatever is live now
    r = kinv_in_process(env, "revert", "--to-plan", "plans/3a-attention-occupancy.yaml")
    assert r.returncode == 0 and "git HEAD" in r.stdout, r.stdout + r.stderr
    assert cfg.read_bytes() == SHIPPED
    from kinv.agent.tools.files.record import record_path

    assert not record_path(cfg).exists()  # a tracked file needs no kept copy: git HEAD is its record


def test_revert_to_plan_with_no_file_of_record_says_so_and_names_the_baseline_by_name(tmp_path, state_dir):
    env = replay_env(tmp_path, state_dir)
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    before = cfg.read_bytes()  # never written by kinv, tracked by no git
    r = kinv_in_process(env, "revert", "--to-plan", "plans/3a-attention-occupancy.yaml")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stdout + r.stderr
    assert "--to-plan-baseline" in r.stderr and cfg.read_bytes() == before


def test_revert_with_a_fresh_state_dir_names_a_way_back_that_restores_the_shipped_bytes(tmp_path, state_dir):
    env = replay_env(tmp_path, state_dir)
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    cfg.write_bytes(SHIPPED)
    _leave_variant_live(cfg, tmp_path)
    r = kinv_in_process(env, "revert")
    assert r.returncode == 1, r.stdout + r.stderr
    way_back = r.stderr.split("restore its shipped bytes with ")[1].split(" (")[0]
    assert way_back == "kinv revert --to-plan PLAN"
    r = kinv_in_process(env, *way_back.split()[1:-1], "plans/3a-attention-occupancy.yaml")  # followed as printed
    assert r.returncode == 0 and cfg.read_bytes() == SHIPPED, r.stdout + r.stderr


def test_revert_to_plan_records_the_real_state_dir_in_the_config_lock(tmp_path, state_dir):
    from kinv.agent.tools.files import configs

    env = replay_env(tmp_path, state_dir)
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    cfg.write_bytes(SHIPPED)
    _leave_variant_live(cfg, tmp_path)
    assert kinv_in_process(env, "revert", "--to-plan", "plans/3a-attention-occupancy.yaml").returncode == 0
    assert configs.last_editor(cfg)["state_dir"] == str(Path(state_dir).resolve())  # not "." (the cwd)


@pytest.mark.slow
def test_an_approval_is_refused_when_the_live_file_moved_after_it(tmp_path, state_dir):
    env = replay_env(tmp_path, state_dir)
    live = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    live.write_bytes(SHIPPED)
    assert run_kinv(env, "run", _small_3a(tmp_path), "--backend", "replay", "--approval", "ask").returncode == 3
    aid = json.loads(run_kinv(env, "pending", "--json").stdout)[0]["id"]
    assert run_kinv(env, "approve", aid).returncode == 0
    moved = SHIPPED.replace(b'"CTAS_PER_SM": 2', b'"CTAS_PER_SM": 3')  # the file of record changed meanwhile
    live.write_bytes(moved)
    r = run_kinv(env, "resume", "3a", "--backend", "replay")
    assert r.returncode == 1 and "no longer applies" in r.stderr and "changed since" in r.stderr, r.stdout + r.stderr
    assert live.read_bytes() == moved  # the approved diff no longer applies: nothing written
