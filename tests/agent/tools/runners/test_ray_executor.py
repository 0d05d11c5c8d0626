"""`kinv campaign --executor ray` on replay: a local Ray cluster of CPU actors stands in for GPUs (replay needs
none).  It reaches the single-process run's decisions, every screening shard pairs its candidates with an
incumbent on its own actor, and an actor killed mid-campaign costs only its in-flight shard."""

from __future__ import annotations

import json
import socket
import sqlite3
from pathlib import Path

import pytest

from tests.utils import kinv_in_process, replay_env, run_kinv

pytest.importorskip("ray")
pytestmark = pytest.mark.ray  # a local Ray cluster: one such test at a time under pytest-xdist

ROOT = Path(__file__).resolve().parents[4]
PLAN = "plans/7-decode-ceiling.yaml"
# the chosen config per level of the single-process replay campaign
# (benchmarks/RESULTS.md, "Campaigns": on replay of the re-recorded sweep)
# what the single-process campaign chooses on the H200 sweep of the #9a kernel (kernels/recordings/h200/)
EXPECTED_LEVELS = {"b1": "BT64/BH16/w8/s2", "b8": "BT32/BH16/w4/s2", "b32": "BT64/BH16/w4/s2",
                   "b64": "BT64/BH16/w4/s2", "b96": "BT64/BH16/w4/s2"}  # fmt: skip


def _campaign(tmp_path, name, *extra, **env_extra):
    env = replay_env(tmp_path / name, tmp_path / name / "state", **env_extra)
    r = run_kinv(env, "campaign", PLAN, "--backend", "replay", "--approval", "auto", "--json", *extra, timeout=1200)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(r.stdout)


def _decisions(summary):
    return ({k: v["config"] for k, v in summary["levels"].items()},
            [(w["ws"], w["item"], w["verdicts"], w["finalists"]) for w in summary["workstreams"]])


RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


@pytest.fixture(scope="module")
def cluster(ray_module_turn):
    """The address of one local Ray cluster (`ray start --head --block`, 2 CPUs) that this module's tests join with
    `--ray-address`, started once and stopped (its own processes only) after the module.  It keeps its own temp dir,
    so a `ray.init()` elsewhere on this machine starts a cluster of its own instead of joining this one."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import tempfile
    import time

    ray_cli = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tempfile.mkdtemp(prefix="kinv-ray-")  # short: Ray's socket paths live under it
    log = open(Path(temp) / "head.log", "w+")  # noqa: SIM115 - closed below
    head = subprocess.Popen([ray_cli, "start", "--head", "--block", "--port", str(port), "--num-cpus", "2",
                             "--include-dashboard", "false", "--temp-dir", temp], env=dict(os.environ, **RAY_ENV),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    address = f"127.0.0.1:{port}"
    try:
        t0 = time.time()
        while "will now block forever" not in Path(log.name).read_text():
            assert head.poll() is None and time.time() - t0 < 180, Path(log.name).read_text()[-2000:]
            time.sleep(0.5)
        yield address
    finally:
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops the processes it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
def test_two_ray_actors_reach_the_single_process_decisions_and_survive_losing_one(tmp_path, closed_7_source, cluster):
    """Two actors on the module's cluster; one dies; the decisions are those of the single-process campaign (the
    shared closed campaign #7, run under the same flags).  (kinv starting a local cluster of its own, with no
    --ray-address, is the README's Ray block: tests/test_readme.py.)"""
    (tmp_path / "ray").mkdir()
    local = json.loads((closed_7_source / "run.out").read_text())
    # actor 1 dies (os._exit) the first time it is handed a shard; the driver re-runs that shard on a new actor
    where = f"actor1@{socket.gethostname()}/cpu"
    ray = _campaign(tmp_path, "ray", "--executor", "ray", "--ray-address", cluster, "--ray-actors", "2",
                    KINV_EXECUTOR_FAULT=f"screen:{where}", KINV_EXECUTOR_FAULT_MARKER=str(tmp_path / "fault-fired"),
                    **RAY_ENV)  # fmt: skip
    assert (tmp_path / "fault-fired").exists()
    assert _decisions(ray) == _decisions(local)
    first = ray["workstreams"][0]
    assert first["executor"] == "ray" and len(first["places"]) == 2
    assert any("died" in loss for loss in first["losses"])
    joint = next(w for w in ray["workstreams"] if w["item"] == "JOINT")
    assert len(joint["measured_on"]) == 2  # the candidates were spread over both actors
    # every candidate was paired with an incumbent on its own actor: two incumbent workers, one per shard
    assert ray["samples"] > local["samples"]

    # the confirmation workstreams measured on the actors too: every level on one actor, both arms there
    store = tmp_path / "ray" / "state"
    con = sqlite3.connect(store / "kinv.db")
    rows = con.execute("select e.workstream, s.level, s.arm, s.place from samples s join experiments e "
                       "on s.experiment = e.id where e.kind in ('ab', 'noise')").fetchall()  # fmt: skip
    assert rows and all(place for *_x, place in rows)
    by_level = {}
    for ws, level, _arm, place in rows:
        by_level.setdefault((ws, level), set()).add(place)
    assert all(len(p) == 1 for p in by_level.values()), by_level  # a level's pairs never span two GPUs
    assert len({p for ps in by_level.values() for p in ps}) == 2  # and the levels were spread over both
    closeout = (store / "reports" / "7c-closeout.md").read_text()
    assert "Measured on (each level's baseline and variant on one GPU" in closeout and "actor1@" in closeout


@pytest.mark.slow
def test_an_existing_cluster_serves_the_campaign_and_an_actor_lost_during_an_ab_round_costs_that_round_only(
        tmp_path, cluster):  # fmt: skip
    """`--ray-address` joins a cluster someone started (`ray start --head`, the module's): the campaign's actors run
    there, and the cluster is still up when kinv is done.  Actor 1 dies at its first A/A or A/B round (the first
    confirmation workstream's); a new actor takes its place with the arms reopened, the round runs again, the
    decisions are the single-process run's (the replay serves each round's recorded samples, so a re-run round
    is the same round), and the close-out of that workstream records the loss."""
    import os
    import shutil
    import subprocess
    import sys

    (tmp_path / "ray").mkdir()
    where = f"actor1@{socket.gethostname()}/cpu"
    ray = _campaign(tmp_path, "ray", "--executor", "ray", "--ray-address", cluster, "--ray-actors", "2",
                    KINV_EXECUTOR_FAULT=f"sample:{where}", KINV_EXECUTOR_FAULT_MARKER=str(tmp_path / "fault-fired"),
                    **RAY_ENV)  # fmt: skip
    assert (tmp_path / "fault-fired").exists()
    levels, chain = _decisions(ray)
    assert [c[1] for c in chain] == ["BTSWEEP", "JOINT", "STAGES", "WARPS", "final"]
    assert chain[-1][2] == {"V1": "accept"}
    assert levels == EXPECTED_LEVELS
    assert ray["workstreams"][0]["executor"] == "ray" and len(ray["workstreams"][0]["places"]) == 2
    ray_cli = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray")
    alive = subprocess.run([ray_cli, "status", "--address", cluster], env=dict(os.environ, **RAY_ENV),
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert alive.returncode == 0, alive.stderr[-1000:]  # kinv disconnected; it did not stop the cluster
    closeout = (tmp_path / "ray" / "state" / "reports" / "7a-closeout.md").read_text()
    assert "Lost during the workstream: actor 1" in closeout and "its round runs again" in closeout
    assert any("during a measurement" in loss for loss in ray["workstreams"][0]["losses"])  # and the summary
    # no A/A or A/B round was stored twice: each (experiment, round, level, arm) once (a screening has an
    # incumbent per shard, so it is left out)
    con = sqlite3.connect(tmp_path / "ray" / "state" / "kinv.db")
    dup = con.execute("select count(*) from (select s.experiment, s.round, s.level, s.arm, count(*) c from samples s "
                      "join experiments e on s.experiment = e.id where e.kind in ('ab', 'noise') "
                      "group by s.experiment, s.round, s.level, s.arm having c > 1)").fetchone()[0]  # fmt: skip
    assert dup == 0


def test_bad_executor_arguments_are_one_line_and_change_nothing(tmp_path):
    env = replay_env(tmp_path, tmp_path / "state")
    for args, needle in ((["--executor", "dask"], "--executor 'dask' is not valid"),
                         (["--ray-actors", "2"], "need --executor ray"),
                         (["--executor", "ray", "--ray-actors", "0"], "--ray-actors 0")):  # fmt: skip
        r = kinv_in_process(env, "campaign", PLAN, "--backend", "replay", *args)
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "state").exists()


@pytest.mark.slow
def test_a_driver_killed_mid_campaign_under_ray_resumes_to_the_same_config(tmp_path, cluster):
    """SIGKILL of the driver while a #7b variant is live on disk, the campaign running on Ray actors; the next
    `kinv campaign --executor ray` restores the file, finishes the chain, and chooses what the unbroken run
    chose at every level."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = replay_env(tmp_path, tmp_path / "state", PYTHONUNBUFFERED="1", **RAY_ENV)
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    before = cfg.read_bytes()
    args = ["campaign", PLAN, "--backend", "replay", "--approval", "auto-config", "--executor", "ray",
            "--ray-address", cluster, "--ray-actors", "2"]  # fmt: skip
    p = subprocess.Popen([sys.executable, "-m", "kinv.agent.cli.app", *args], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)  # fmt: skip
    seen, t0, in_7b = "", time.time(), False
    while time.time() - t0 < 600:
        line = p.stdout.readline()
        seen += line
        in_7b = in_7b or line.startswith("#7b ")  # the workstream's header; its patch lines name the variant
        if (in_7b and "patched to" in line) or (not line and p.poll() is not None):
            break
    assert p.poll() is None and in_7b and "patched to" in line, seen[-2000:]
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    r = run_kinv(env, *args, timeout=900)
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-2000:]  # auto-config: the adoption waits for a person
    assert cfg.read_bytes() == before  # the variant the kill left on disk was restored; nothing adopted yet
    summary = json.loads(run_kinv(env, "campaign", PLAN, "--backend", "replay", "--json").stdout)
    assert {k: v["config"] for k, v in summary["levels"].items()} == EXPECTED_LEVELS


@pytest.mark.slow
def test_a_lost_actor_that_cannot_be_replaced_stops_with_one_line_instead_of_waiting(monkeypatch, cluster):
    """A node gone with its GPU: the replacement actor finds no room.  The executor waits a bounded time and says
    so in one line (the campaign then stops; `kinv campaign` resumes it later), instead of hanging."""
    from kinv.agent.errors import ExecutorError
    from kinv.agent.tools.runners.executor import RayExecutor

    monkeypatch.setenv("KINV_FORCE_NO_GPU", "1")
    for k, v in RAY_ENV.items():
        monkeypatch.setenv(k, v)
    ex = RayExecutor("replay", address=cluster, actors=2)  # the cluster's 2 CPUs: no room for a third actor
    try:
        monkeypatch.setenv("KINV_RAY_PLACE_TIMEOUT_S", "0")  # no actor starts in no time
        with pytest.raises(ExecutorError) as got:
            ex.replace(1, "in a test")
        msg = str(got.value)
        assert "actor 1 died and no new actor could be placed within 0 s" in msg and "\n" not in msg
        assert "run kinv campaign again to resume" in msg
        assert ex.lost and "actor 1" in ex.lost[0]
    finally:
        ex.close()


@pytest.mark.slow
def test_a_remote_arm_answers_setup_and_sample_like_a_local_one(monkeypatch, cluster):
    """A Ray-hosted arm set up and sampled one level at a time gives the replay's sample for that round, the
    same as the arm opened in this process, and says which actor timed it."""
    from kinv.agent.tools.backends import base
    from kinv.agent.tools.runners import bench
    from kinv.agent.tools.runners.executor import RayExecutor

    monkeypatch.setenv("KINV_FORCE_NO_GPU", "1")
    seed = {"kernel": "mla_decode", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}
    env = {"TARGET_CTAS": "512"}
    from kinv.agent.plan_file import load_plan

    level = next(lv for lv in load_plan(str(ROOT / PLAN))[0].levels() if lv.label == "b32")
    local = bench.get_backend("replay").open("A0", "mla_decode", seed, env, replica=0)
    for k, v in RAY_ENV.items():
        monkeypatch.setenv(k, v)
    ex = RayExecutor("replay", address=cluster, actors=2)
    try:
        be = ex.measuring_backend()
        assert isinstance(be, base.Backend)
        arm = be.open("A0", "mla_decode", seed, env, replica=0)
        assert arm.setup(level) == local.setup(level)  # the actor's set-up record, not an empty one
        got = arm.sample(level, 3)
        assert got["us"] == local.sample(level, 3)["us"] and got["place"].startswith("actor")
        arm.close()
    finally:
        ex.close()
        local.close()
