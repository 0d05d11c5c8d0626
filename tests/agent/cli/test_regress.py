"""``kinv regress BASE [HEAD]`` on replay, in a git repository made here: a revision against itself is never decided
improved or regressed, a planted slowdown (a committed config whose recorded samples are slower) is caught as
regressed, every comparison is stored and read back by ``--history``, and bad input is one line that creates
nothing.  Nothing in the checkout is switched or written."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.utils import ROOT, kinv_in_process, replay_env

# two levels of the shipped recording where the planted change (num_warps 4 -> 8 over the shipped config) is
# recorded 5.5% and 3.9% slower on the H200: small enough to gate quickly on the interpreter
LEVELS = "levels: [64, 96]"
MARGINS = """kernels:
  mla_decode:
    plan: plans/ci.yaml
    stats: {threshold: 0.01, conf: 0.95, aa_rounds: 8, aa_arms: 2, quick_rounds: 8, step_rounds: 8, max_rounds: 16}
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """A checkout of kinv's kernel package and a CI plan: commit 1 ships the config as it is, commit 2 plants a
    slowdown (num_warps 8 at every level the shipped config runs with 4)."""
    r = tmp_path_factory.mktemp("repo")
    shutil.copytree(ROOT / "kernels", r / "kernels", ignore=shutil.ignore_patterns("__pycache__", "recordings"))
    (r / "plans" / "regress").mkdir(parents=True)
    plan = (ROOT / "plans" / "3a-attention-occupancy.yaml").read_text()
    assert "levels: [1, 8, 32, 64, 96]" in plan
    (r / "plans" / "ci.yaml").write_text(plan.replace("levels: [1, 8, 32, 64, 96]", LEVELS))
    (r / "plans" / "regress" / "margins.yaml").write_text(MARGINS)
    _git(r, "init", "-q", "-b", "main")
    _git(r, "-c", "user.email=t@example.com", "-c", "user.name=t", "add", "-A")
    _git(r, "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qm", "shipped")
    cfg = r / "kernels" / "configs" / "mla_decode.json"
    data = json.loads(cfg.read_text())
    assert data["num_warps"] == 4
    cfg.write_text(json.dumps({**data, "num_warps": 8}, indent=2) + "\n")
    _git(r, "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qam", "planted: 8 warps")
    return r


@pytest.fixture(scope="module")
def runs(repo, tmp_path_factory):
    """The self-comparison and the planted slowdown, run once into one state dir (the history reads both)."""
    tmp = tmp_path_factory.mktemp("runs")
    state = tmp / "state"
    env = replay_env(tmp, state)
    before = (_git(repo, "rev-parse", "HEAD"), _git(repo, "status", "--porcelain"))
    out = {}
    for name, args in (("self", ["HEAD", "HEAD", "--kernel", "mla_decode"]), ("planted", ["main~1", "main"])):
        files = {k: tmp / f"{name}.{k}" for k in ("md", "json", "xml")}
        r = kinv_in_process(env, "regress", *args, "--repo", repo, "--backend", "replay", "--markdown", files["md"],
                            "--json", files["json"], "--junit", files["xml"], cwd=repo)  # fmt: skip
        out[name] = (r, {k: f.read_text() if f.exists() else "" for k, f in files.items()})
    out["untouched"] = before == (_git(repo, "rev-parse", "HEAD"), _git(repo, "status", "--porcelain"))
    out["env"], out["state"] = env, state
    return out


def test_a_revision_against_itself_is_never_decided(runs):
    r, files = runs["self"]
    assert r.returncode in (0, 5), r.stderr  # nothing regressed; at most undecided
    comp = json.loads(files["json"])
    verdicts = {lv["label"]: lv["verdict"] for lv in comp["kernels"][0]["levels"]}
    assert set(verdicts) == {"b64", "b96"}
    assert not {"improved", "regressed"} & set(verdicts.values()), verdicts
    assert comp["exit_code"] == r.returncode and comp["base"]["sha"] == comp["head"]["sha"]
    assert "<failure" not in files["xml"]


def test_a_planted_slowdown_is_caught_as_regressed(runs):
    r, files = runs["planted"]
    assert r.returncode == 4, r.stdout + r.stderr
    comp = json.loads(files["json"])
    k = comp["kernels"][0]
    assert k["kernel"] == "mla_decode" and k["differs"] == ["config"] and k["verdict"] == "regressed"
    for lv in k["levels"]:  # recorded 5.5% and 3.9% slower: both regressed, each interval wholly below zero
        assert lv["verdict"] == "regressed" and lv["ci_high"] < 0 < lv["threshold"], lv
        assert lv["band"] is not None  # the A/A's band is reported beside it
    # what a reviewer reads: the verdicts, both revisions, the machine and the close-out
    md = files["md"]
    assert "regressed" in md and comp["base"]["sha"][:10] in md and comp["head"]["sha"][:10] in md
    assert "NVIDIA H200" in md and "closeout.md" in md and "| b64 |" in md
    assert md.count("<failure") == 0 and files["xml"].count("<failure") == 2
    assert Path(comp["closeout"]).is_file()
    assert runs["untouched"]  # the checkout's HEAD and files are as they were


def test_history_lists_both_comparisons_with_the_drift(runs):
    r = kinv_in_process(runs["env"], "regress", "--history", "mla_decode")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("on replay of samples recorded on NVIDIA H200") == 2
    assert "drift (sum of the point estimates" in r.stdout and "over 2 comparison(s)" in r.stdout


def test_nothing_differs_measures_nothing(repo, tmp_path):
    env = replay_env(tmp_path, tmp_path / "state")
    r = kinv_in_process(env, "regress", "main", "--repo", repo, "--backend", "replay", cwd=repo)
    assert r.returncode == 0, r.stderr
    assert "nothing was measured" in r.stdout and "Unchanged, not measured: mla_decode, moe_expert_gemm" in r.stdout


def test_the_budget_leaves_levels_undecided(repo, tmp_path):
    env = replay_env(tmp_path, tmp_path / "state")
    r = kinv_in_process(env, "regress", "main~1", "main", "--repo", repo, "--backend", "replay", "--budget", "0.5",
                        "--json", "-", cwd=repo)  # fmt: skip
    assert r.returncode == 5, r.stderr
    k = json.loads(r.stdout)["kernels"][0]
    assert k["verdict"] == "undecided" and "--budget" in k["reason"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["no-such-rev"], "revision 'no-such-rev' is not a commit"),
        (["main", "--budget", "lots"], "--budget 'lots' is not valid"),
        (["main", "--kernel", "nope"], "unknown kernel 'nope'"),
        (["main", "--markdown", "/no/such/dir/c.md"], "--markdown /no/such/dir/c.md: its folder"),
        ([], "name BASE"),
        (["--history", "mla_decode"], "no kinv state"),
    ],
)
def test_bad_input_is_one_line_and_creates_nothing(repo, tmp_path, args, needle):
    state = tmp_path / "state"
    r = kinv_in_process(replay_env(tmp_path, state), "regress", *args, "--repo", repo, "--backend", "replay",
                        cwd=repo)  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not state.exists()


def test_kernel_sources_only_takes_base_s_kernel_and_config_over_head_s_adapter(tmp_path):
    """An adapter change alone is a difference to judge; with --kernel-sources-only BASE brings only its kernel
    sources and config (an old revision whose adapter predates today's harness still runs), so it is not."""
    from kinv.agent.tools.files.revisions import resolve
    from kinv.agent.tools.runners.regress_prepare import candidates

    r = tmp_path / "repo"
    shutil.copytree(ROOT / "kernels", r / "kernels", ignore=shutil.ignore_patterns("__pycache__", "recordings"))
    _git(r, "init", "-q")
    ident = ["-c", "user.email=t@example.com", "-c", "user.name=t"]
    _git(r, *ident, "add", "-A")
    _git(r, *ident, "commit", "-qm", "one")
    with (r / "kernels" / "mla_decode_adapter.py").open("a") as f:
        f.write("\n\ndef _added():\n    return 1\n")
    _git(r, *ident, "commit", "-qam", "an adapter change")
    base, head = resolve(r, "HEAD~1"), resolve(r, "HEAD")
    found, _, _ = candidates(r, base, head, ["mla_decode"])
    assert found[0][1] == ["reference"]  # the adapter holds the metric definitions the reference hash covers
    found, _, _ = candidates(r, base, head, ["mla_decode"], sources_only=True)
    (_a, differs, bf, hf) = found[0]
    assert differs == [] and bf["mla_decode_adapter.py"] == hf["mla_decode_adapter.py"]


BENCH = """import argparse, json, time
ap = argparse.ArgumentParser()
ap.add_argument("--n", type=int)
n = ap.parse_args().n
WORK = 1
t0 = time.perf_counter()
s = 0
for _ in range(WORK):
    for i in range(n):
        s += i
print(json.dumps({"rate": n / (time.perf_counter() - t0)}))
"""


@pytest.mark.slow  # some 80 runs of a command, each a fresh interpreter
def test_a_command_benchmark_is_judged_from_each_revision_s_own_checkout(tmp_path):
    """A plan's own command (``kernel: command``) runs from each revision's files: against itself it is never
    decided either way; a committed change that makes the command do twice the work is caught as regressed."""
    r = tmp_path / "repo"
    (r / "plans").mkdir(parents=True)
    plan = (ROOT / "plans" / "cpu-matmul-threads.yaml").read_text()
    plan = plan.replace('["{python}", "examples/cpu_matmul.py", "--n", "{n}", "--seconds", "0.3"]',
                        '["{python}", "bench.py", "--n", "{n}"]').replace("levels: [{n: 128}, {n: 512}]",
                                                                       "levels: [{n: 300000}]")  # fmt: skip
    plan = plan.replace("gflops", "rate").replace("unit: GFLOP/s", "unit: adds/s")
    (r / "plans" / "cmd.yaml").write_text(plan)
    (r / "bench.py").write_text(BENCH)
    ident = ["-c", "user.email=t@example.com", "-c", "user.name=t"]
    _git(r, "init", "-q", "-b", "main")
    _git(r, *ident, "add", "-A")
    _git(r, *ident, "commit", "-qm", "the benchmark")
    (r / "bench.py").write_text(BENCH.replace("WORK = 1", "WORK = 2"))
    _git(r, *ident, "commit", "-qam", "planted: twice the work")
    env = replay_env(tmp_path, tmp_path / "state")
    common = ["--repo", r, "--backend", "command", "--plan", r / "plans" / "cmd.yaml", "--json", "-"]
    same = kinv_in_process(env, "regress", "HEAD", "HEAD", "--kernel", "command", *common, cwd=r)
    assert same.returncode in (0, 5), same.stderr
    levels = json.loads(same.stdout)["kernels"][0]["levels"]
    assert levels and not {"improved", "regressed"} & {lv["verdict"] for lv in levels}
    planted = kinv_in_process(env, "regress", "main~1", "main", *common, cwd=r)
    assert planted.returncode == 4, planted.stdout + planted.stderr
    k = json.loads(planted.stdout)["kernels"][0]
    assert k["differs"] == ["1 file(s): bench.py"] and [lv["verdict"] for lv in k["levels"]] == ["regressed"]
    assert _git(r, "status", "--porcelain") == ""  # the checkout was never written
