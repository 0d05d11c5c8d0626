"""`kinv adopt WS VARIANT`: a measured winner becomes the live config as a journaled, reviewed change."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.utils import kinv_in_process, replay_env, run_kinv


def test_adopt_shows_then_writes_the_winner_journaled_with_a_message_citing_the_close_out(tmp_path, state_dir,
                                                                                          closed_3b):
    env = replay_env(tmp_path, state_dir)
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    before = cfg.read_bytes()

    shown = kinv_in_process(env, "adopt", "3b", "V1")  # review first: nothing is written
    assert shown.returncode == 0, shown.stderr
    assert cfg.read_bytes() == before
    assert '-  "BLOCK_T": 16,' in shown.stdout and '+  "BLOCK_T": 32,' in shown.stdout
    assert "3b-closeout.md" in shown.stdout and "b64  +" in shown.stdout and "kinv adopt 3b V1 --yes" in shown.stdout

    done = json.loads(kinv_in_process(env, "adopt", "3b", "V1", "--yes", "--json").stdout)
    assert json.loads(cfg.read_text())["BLOCK_T"] == 32 and done["written"] and done["kind"] == "config"
    message = Path(done["message_file"]).read_text()
    assert message.startswith("mla_decode: adopt #3b V1 (BLOCK_T 32)") and "Close-out:" in message
    # final: neither a revert nor the next start puts the old baseline back
    assert kinv_in_process(env, "revert").returncode == 0
    assert json.loads(cfg.read_text())["BLOCK_T"] == 32
    backups = json.loads(kinv_in_process(env, "backups", "--json").stdout)
    assert any(b["sha"] and b["path"] == str(cfg.resolve()) for b in backups)  # the old file is kept
    # the file moved on: a second adoption from the same measurements is refused
    again = kinv_in_process(env, "adopt", "3b", "V1", "--yes")
    assert again.returncode == 1 and "already runs" in again.stderr


def test_adopt_refuses_what_was_not_a_win_and_names_what_was_measured(tmp_path, state_dir, closed_3a):
    env = replay_env(tmp_path, state_dir)
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    before = cfg.read_bytes()
    r = kinv_in_process(env, "adopt", "3a", "V1", "--yes")
    assert r.returncode == 2 and "was not a win (reject" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = kinv_in_process(env, "adopt", "3a", "V9")
    assert r.returncode == 2 and "measured: V1, V2" in r.stderr
    assert cfg.read_bytes() == before


def test_a_level_conditional_proposal_covers_neighbouring_winning_levels_with_one_range():
    from kinv.agent.plan_file import load_plan
    from kinv.agent.workstream import planner
    from kinv.kernels.launch_config import describe

    plan, _ = load_plan("plans/3b-tile-shape.yaml")
    key = {lv.dims["batch"]: lv.key for lv in plan.levels()}
    won = {key[1]: "regressed", key[8]: "equivalent", key[32]: "improved", key[64]: "improved", key[96]: "improved"}
    cond = planner.level_conditional(plan, plan.variant("V1"), won)
    assert describe(cond) == "BT16/BH16/w4/s2 [v4flash b>=9: BT32]"  # one override, open past the largest level
    cond = planner.level_conditional(plan, plan.variant("V1"), {**won, key[64]: "regressed"})
    assert describe(cond) == "BT16/BH16/w4/s2 [v4flash b9-32: BT32; v4flash b>=65: BT32]"
    a = plan.adapter
    for b, want in ((8, "BT16"), (20, "BT32"), (48, "BT16"), (80, "BT32"), (512, "BT32")):
        assert a.params_for(cond, a.level({**plan.levels()[0].dims, "batch": b})).short().startswith(want)


def test_a_mixed_variant_whose_change_is_an_override_is_adopted_only_where_it_won():
    # #9c on the H200: V1 adds {shape: v3, batch_min: 96, ...}; improved at b96, regressed at b128. Adopting it
    # where it won must put the b96 change first (the first matching override wins) and only for V3, the shape
    # it was measured on; it used to find "no per-level overrides" because the base tunables were unchanged.
    from kinv.agent.plan_file import load_plan
    from kinv.agent.workstream import planner
    from kinv.kernels.launch_config import describe

    plan, _ = load_plan("plans/9c-decode-shape.yaml")
    key = {lv.dims["batch"]: lv.key for lv in plan.levels()}
    cond = planner.level_conditional(plan, plan.variant("V1"), {key[64]: "equivalent", key[96]: "improved",
                                                                key[128]: "regressed"})  # fmt: skip
    # the range covers the batches between the measured neighbours (b65-96), as a person would write it
    assert describe(cond) == "BT64/BH16/w4/s2/cps2 [v3 b65-96: BT32,cps3,mrg1; b<=1: w8,tma1; b>=64: mrg1]"
    a = plan.adapter
    for shape, b, want in (("v3", 96, "BT32/BH16/w4/s2/cps3/mrg1"), ("v3", 128, "BT64/BH16/w4/s2/cps2/mrg1"),
                           ("v4flash", 96, "BT64/BH16/w4/s2/cps2/mrg1"), ("v3", 1, "BT64/BH16/w8/s2/cps2/tma1")):
        level = a.level({"shape": shape, "heads": 16, "page_size": 64, "context": 4096, "batch": b})
        assert a.params_for(cond, level).short() == want
    # nothing improved: nothing to adopt
    assert planner.level_conditional(plan, plan.variant("V1"), {key[128]: "regressed"}) is None


# ---- a write is measured against what it replaces ------------------------------------------------------------
# #3b measures the seed's BT16 from its plan (baseline_on_disk: false), whatever the live file holds.  These live
# files are ones the H200 recordings serve at every level of #3b (from the campaign sweep), so the confirming A/B
# of V1 (BT32/BH16/w4/s2) against them runs on replay.
CAMPAIGN_7_LIVE = {  # what campaign #7 adopted: BT64 [b<=1: w8; b2-8: BT32]
    "kernel": "mla_decode", "description": "Adopted from campaign #7 by kinv adopt.",
    "BLOCK_T": 64, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2,
    "overrides": [{"batch_max": 1, "num_warps": 8}, {"batch_min": 2, "batch_max": 8, "BLOCK_T": 32}],
}  # fmt: skip
HAND_TUNED_LIVE = {  # BT16 but BT64/w8 for a lone request, and a v3 override with tunables #3b never measured
    "kernel": "mla_decode", "description": "Hand-tuned: BT64 with 8 warps for a lone request.",
    "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2,
    "overrides": [{"batch_min": 96, "batch_max": 96, "shape": "v3", "BLOCK_T": 32, "CTAS_PER_SM": 3, "MERGE": 1},
                  {"batch_max": 1, "BLOCK_T": 64, "num_warps": 8}],
}  # fmt: skip


def _write_live(env, cfg) -> Path:
    path = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    return path


@pytest.fixture(scope="module")
def closed_3b_over_campaign_7(tmp_path_factory):
    """#3b closed out on replay while the live file was campaign #7's config (as in the field)."""
    tmp = tmp_path_factory.mktemp("adopt3b")
    env = replay_env(tmp, tmp / "state")
    _write_live(env, CAMPAIGN_7_LIVE)
    r = run_kinv(env, "run", "plans/3b-tile-shape.yaml", "--backend", "replay", "--approval", "auto", timeout=1200)
    assert r.returncode == 0, r.stderr
    return tmp


@pytest.fixture
def after_3b(closed_3b_over_campaign_7, tmp_path):
    """A copy of the closed #3b (state dir and live config dir) of this test's own."""
    shutil.copytree(closed_3b_over_campaign_7 / "state", tmp_path / "s")
    shutil.copytree(closed_3b_over_campaign_7 / "configs", tmp_path / "c")
    env = dict(replay_env(tmp_path, tmp_path / "s"), KINV_CONFIG_DIR=str(tmp_path / "c"))
    return env, tmp_path / "c" / "mla_decode.json"


def _experiments(env) -> list[tuple]:
    with sqlite3.connect(Path(env["KINV_STATE_DIR"]) / "kinv.db") as c:
        return c.execute("select id, kind, status from experiments order by id").fetchall()


def _doctor_says(env) -> str:
    r = kinv_in_process(env, "doctor", "--json")
    return next(f["detail"] for f in json.loads(r.stdout) if f["check"] == "config mla_decode")


def test_adopt_refuses_a_variant_the_confirming_ab_shows_slower_than_the_live_file(after_3b):
    # In the field: "BT32/BH16/w4/s2, replacing BT64/BH16/w4/s2 [b<=1: w8; b2-8: BT32] … b1 +44.50% … improved",
    # though kinv's own samples of the two files show BT32 11-23% slower at b1, b32, b64 and b96.
    env, cfg = after_3b
    before = cfg.read_bytes()
    for args in (("adopt", "3b", "V1"), ("adopt", "3b", "V1", "--yes")):  # (--backend auto: replay here)
        r = kinv_in_process(env, *args)
        assert r.returncode == 1, r.stdout + r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "improves on the live file" in r.stderr
        assert "at no level" in r.stderr and "b1 -" in r.stderr and "regressed" in r.stderr
        assert "+44.50%" not in r.stdout + r.stderr and "nothing to adopt" in r.stderr
        assert cfg.read_bytes() == before
    confirms = [e for e in _experiments(env) if e[1] == "confirm"]
    assert len(confirms) == 1 and confirms[0][2] == "done"  # measured once, re-read the second time
    # #3b measured BT16 from its plan, never this file: it is not "#3b's baseline"
    says = _doctor_says(env)
    assert "#3b's baseline" not in says and "when #3b ran" in says, says


def test_adopt_writes_the_variant_only_where_it_beat_the_live_file_and_drops_nothing(after_3b):
    from kinv.agent.plan_file import load_plan
    from kinv.kernels.launch_config import validate_config

    env, cfg = after_3b
    _write_live(env, HAND_TUNED_LIVE)
    shown = kinv_in_process(env, "adopt", "3b", "V1", "--backend", "replay")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(cfg.read_text()) == HAND_TUNED_LIVE  # review only
    before_text = cfg.read_text()
    done = json.loads(kinv_in_process(env, "adopt", "3b", "V1", "--yes", "--json", "--backend", "replay").stdout)
    assert done["written"] and done["kind"] == "overrides" and done["confirm"]
    # the diff a person reviews applies to the live file's bytes and yields exactly the bytes written
    from kinv.agent.tools.files.config_text import apply_unified_diff
    assert apply_unified_diff(before_text, done["diff"], cfg) == cfg.read_text()
    levels = done["confirm"]["levels"]
    assert levels["v4flash/h16/p64/ctx4096/b1"] == "regressed"  # BT32/w4 against the live BT64/w8
    assert sorted(k for k, v in levels.items() if v == "improved") == [
        f"v4flash/h16/p64/ctx4096/b{b}" for b in (32, 64, 8, 96)]  # fmt: skip
    written = json.loads(cfg.read_text())
    plan, _ = load_plan("plans/3b-tile-shape.yaml")
    a = plan.adapter
    live, new = validate_config(HAND_TUNED_LIVE), validate_config(written)
    cand = plan.variant_config(plan.variant("V1"))
    for lv in plan.levels():  # the candidate only where it won; the live file's choice everywhere else
        want = cand if levels[lv.key] == "improved" else live
        assert a.params_for(new, lv) == a.params_for(want, lv), lv.key
    # nothing the candidate did not measure is dropped: the v3 override, its CTAS_PER_SM / MERGE, the description
    assert HAND_TUNED_LIVE["overrides"][0] in written["overrides"] and HAND_TUNED_LIVE["overrides"][1] in written["overrides"]
    v3 = a.level({"shape": "v3", "heads": 16, "page_size": 64, "context": 4096, "batch": 96})
    assert a.params_for(new, v3) == a.params_for(live, v3)
    assert written["description"].startswith(HAND_TUNED_LIVE["description"]) and "#3b V1" in written["description"]
    assert [k for k in written if k in HAND_TUNED_LIVE] == list(HAND_TUNED_LIVE)
    # the commit message cites the comparison with the live file, not the plan's A/B against BT16
    msg = Path(done["message_file"]).read_text()
    assert "against the live file" in msg and "+44.50%" not in msg
    assert f"experiment {done['confirm']['experiment']}" in msg and "-> the live file's choice stays" in msg
    assert "(99.857% CI)" in msg
    # doctor names where the file came from
    says = _doctor_says(env)
    assert "adopted from #3b V1" in says and "confirmed against the file it replaced" in says, says


def test_adopt_without_a_replay_recording_of_the_pair_refuses_in_one_line_and_writes_nothing(after_3b):
    env, cfg = after_3b
    shipped = json.loads((Path(__file__).resolve().parents[3] / "kernels" / "configs" / "mla_decode.json").read_text())
    _write_live(env, {**shipped, "num_stages": 3})  # the shipped file at 3 stages: no recording serves it on replay
    before, exps = cfg.read_bytes(), _experiments(env)
    for extra in ((), ("--yes",), ("--yes", "--json")):
        r = kinv_in_process(env, "adopt", "3b", "V1", "--backend", "replay", *extra)
        assert r.returncode == 1, r.stdout + r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "no recording of that pair" in r.stderr and "--backend cuda" in r.stderr and "nothing written" in r.stderr
        assert cfg.read_bytes() == before and _experiments(env) == exps
        assert not (Path(env["KINV_STATE_DIR"]) / "adoptions").exists()


def test_an_adoptions_samples_saved_as_a_recording_are_served_by_replay(after_3b, tmp_path):
    # On the GPU, kinv adopt saves the confirming A/B's samples of the config it writes; here the same function is
    # given a replayed confirming A/B, and the replay backend must then serve the new live file to kinv bench.
    import statistics

    from kinv.agent.store.db import Store
    from kinv.agent.workstream import adopt

    env, cfg = after_3b
    _write_live(env, HAND_TUNED_LIVE)
    done = json.loads(kinv_in_process(env, "adopt", "3b", "V1", "--yes", "--json", "--backend", "replay").stdout)
    recs = tmp_path / "recordings"
    (recs / "h200").mkdir(parents=True)
    for f in (Path(__file__).resolve().parents[3] / "kernels" / "recordings" / "h200").glob("*.jsonl.gz"):
        (recs / "h200" / f.name).symlink_to(f)
    store = Store(env["KINV_STATE_DIR"])
    exp = done["confirm"]["experiment"]
    arms = {k: ("B" if v == "improved" else "A") for k, v in done["confirm"]["levels"].items()}
    from kinv.kernels.launch_config import load_config

    out = adopt.record_replay(store, exp, arms, load_config(cfg), directory=recs)
    assert out.parent == recs / "h200" and out.name.startswith("mla_decode-adopted-")
    bench = kinv_in_process(dict(env, KINV_RECORDINGS=str(recs)), "bench", "--backend", "replay", "--json")
    assert bench.returncode == 0, bench.stderr
    served = {m["level"]: m["us"] for m in json.loads(bench.stdout)}  # the recording, not the sweep, serves it
    for lv, arm in arms.items():  # kinv bench takes 5 samples: rounds 0-4 of the arm that runs there
        recorded = [s["us"] for s in store.samples(exp) if s["level"] == lv and s["arm"] == arm and s["round"] < 5]
        assert served[lv] == pytest.approx(statistics.median(recorded)), lv


@pytest.mark.slow
def test_a_campaigns_adoption_is_confirmed_against_the_live_file_and_keeps_what_it_did_not_measure(tmp_path):
    # Campaign #7 measures the seed's BT16 from its plan.  Its adoption used to replace whatever the live file held
    # (dropping its overrides and tunables) and to quote the final A/B against BT16 in the commit message.
    # (its joint item alone: it searches the whole space, and its chosen config is what the adoption writes)
    import yaml

    from kinv.agent.plan_file import load_plan
    from kinv.kernels.launch_config import validate_config

    data = yaml.safe_load((Path(__file__).resolve().parents[3] / "plans" / "7-decode-ceiling.yaml").read_text())
    data["backlog"] = [b for b in data["backlog"] if b["id"] in ("JOINT", "OEA")]
    plan_file = tmp_path / "7-joint.yaml"
    plan_file.write_text(yaml.safe_dump(data, sort_keys=False))
    env = replay_env(tmp_path, tmp_path / "state")
    cfg = _write_live(env, HAND_TUNED_LIVE)
    r = run_kinv(env, "campaign", plan_file, "--backend", "replay", "--approval", "auto", "--json", timeout=1500)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["adopted"], summary.get("adoption")
    final = [w for w in summary["workstreams"] if w["item"] == "final"][0]
    msg = Path(env["KINV_STATE_DIR"], "adoptions", f"{final['ws'].lstrip('#')}-V1.txt").read_text()
    assert "against the live file" in msg and "its effects are not claimed here" in msg
    chosen = validate_config(summary["config_json"])
    written, live = json.loads(cfg.read_text()), validate_config(HAND_TUNED_LIVE)
    new = validate_config(written)
    plan, _ = load_plan("plans/7-decode-ceiling.yaml")
    a = plan.adapter
    with sqlite3.connect(Path(env["KINV_STATE_DIR"]) / "kinv.db") as c:
        exp = c.execute("select id from experiments where kind = 'confirm' order by id desc").fetchone()[0]
        verdicts = dict(c.execute("select level, verdict from verdicts where experiment = ?", [exp]).fetchall())
    assert f"experiment {exp}" in msg
    for lv in plan.levels():
        want = chosen if verdicts[lv.key] == "improved" else live
        assert a.params_for(new, lv) == a.params_for(want, lv), lv.key
    for ov in HAND_TUNED_LIVE["overrides"]:  # the v3 override (CTAS_PER_SM, MERGE) and the b1 one survive
        assert ov in written["overrides"]
    assert written["description"].startswith(HAND_TUNED_LIVE["description"])


# ---- overrides conditioned on the context length ------------------------------------------------------------
def _mla_level(**dims):
    from kinv.kernels.adapter import get_adapter

    return get_adapter("mla_decode").level({"shape": "v3", "heads": 16, "page_size": 64, "context": 4096,
                                            "batch": 96, **dims})  # fmt: skip


def test_an_override_tuned_at_one_context_stays_off_at_a_longer_one():
    # On the H200 an override at V3/b96 tuned at context 4096 also applied at 16384, where it cost 2.4%: an
    # override may now say which contexts it is for, and the label says so too.
    from kinv.kernels.adapter import get_adapter
    from kinv.kernels.errors import ConfigError
    from kinv.kernels.launch_config import describe

    a = get_adapter("mla_decode")
    cfg = a.validate_config({"kernel": "mla_decode", "BLOCK_T": 64, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2,
                             "overrides": [{"shape": "v3", "batch_min": 96, "batch_max": 96, "context_max": 4096,
                                            "BLOCK_T": 32}]})  # fmt: skip
    assert a.params_for(cfg, _mla_level(context=4096)).BLOCK_T == 32
    assert a.params_for(cfg, _mla_level(context=16384)).BLOCK_T == 64
    assert a.params_for(cfg, _mla_level(context=4096, shape="v4flash")).BLOCK_T == 64
    assert describe(cfg) == "BT64/BH16/w4/s2 [v3 b96-96 ctx<=4096: BT32]"
    with pytest.raises(ConfigError, match="context_min=8192 is above context_max=4096"):
        a.validate_config({**cfg, "overrides": [{"context_min": 8192, "context_max": 4096, "BLOCK_T": 32}]})


def test_adopting_where_a_variant_won_pins_the_context_it_was_measured_at():
    from kinv.agent.workstream.adopt import where_it_won
    from kinv.kernels.adapter import get_adapter

    a = get_adapter("mla_decode")
    live = a.validate_config({"kernel": "mla_decode", "BLOCK_T": 64, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2})
    cand = a.validate_config({**live, "BLOCK_T": 32})
    at_4096 = _mla_level(context=4096)
    out = a.validate_config(where_it_won(a, live, live, cand, [at_4096], [at_4096.key]))
    assert out["overrides"][0]["context_min"] == out["overrides"][0]["context_max"] == 4096
    assert a.params_for(out, at_4096).BLOCK_T == 32
    assert a.params_for(out, _mla_level(context=16384)).BLOCK_T == 64  # not measured there: the live file's choice
