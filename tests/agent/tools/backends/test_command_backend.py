"""Bring your own benchmark: a plan of ``kernel: command`` runs the user's command once per sample, in each arm's own
environment, with kinv's statistics unchanged.  The example is real: numpy's CPU matmul under OMP_NUM_THREADS=2
against 1 (examples/cpu_matmul.py, plans/cpu-matmul-threads.yaml)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kinv.agent.errors import VariantFailed
from kinv.agent.plan_file import load_plan
from kinv.agent.tools.backends import get_backend
from kinv.agent.tools.backends.command import metric_of
from tests.utils import kinv_in_process, replay_env

ROOT = Path(__file__).resolve().parents[4]
PLAN = ROOT / "plans" / "cpu-matmul-threads.yaml"


def test_the_metric_is_read_from_the_last_json_line_or_a_regex():
    out = 'warming up\n{"gflops": 1.0}\nnoise {not json}\n{"gflops": 61.5, "n": 512}\n'
    assert metric_of(out, {"json_key": "gflops"}) == 61.5
    assert metric_of('{"result": {"tok_s": 845}}', {"json_key": "result.tok_s"}) == 845.0
    assert metric_of("throughput: 801.2 tok/s\nthroughput: 845.0 tok/s\n", {"regex": r"throughput: ([0-9.]+)"}) == 845.0
    assert metric_of("no number here", {"regex": r"tok/s ([0-9.]+)"}) is None
    assert metric_of('{"gflops": "fast"}', {"json_key": "gflops"}) is None


def _plan_with(tmp_path, **workload):
    data = yaml.safe_load(PLAN.read_text())
    data["workload"].update(workload)
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _arm_at(plan_path, tmp_path):
    plan, _ = load_plan(plan_path)
    be = get_backend("command")
    be.log_dir = tmp_path / "commands"
    arm = be.open("baseline", "command", {"kernel": "command"}, plan.environment)
    return arm, plan.levels()[0]


@pytest.mark.parametrize("command, says", [
    (["{python}", "-c", "import sys; print('boom'); sys.exit(3)"], "exited 3 (boom)"),
    (["{python}", "-c", "print('{{\"other\": 1}}')  # n={n}"], "printed no positive metric (gflops)"),
    (["{python}", "-c", "import time; time.sleep(30)  # n={n}"], "ran past its 1 s timeout"),
])  # fmt: skip
def test_a_run_that_fails_hangs_or_prints_no_metric_is_one_line_and_its_output_is_kept(tmp_path, command, says):
    arm, level = _arm_at(_plan_with(tmp_path, command=command, timeout_s=1), tmp_path)
    with pytest.raises(VariantFailed) as exc:
        arm.run(level, "check")
    assert says in str(exc.value) and "\n" not in str(exc.value)
    lost = arm.sample(level, 0)  # a timed run's failure is a lost sample, not the arm's end
    assert lost["us"] is None and says in lost["lost"] and "\n" not in lost["lost"]
    assert list((tmp_path / "commands").glob("baseline-n128-r0.log"))


# One counter file per arm (argv[1] + the arm's FLAKY): mode 1 fails every fifth timed run, mode 2 every run after
# the correctness check and the env check.
FLAKY = ("import sys, os, json, random; mode = os.environ['FLAKY']; p = sys.argv[1] + mode; "
         "f = open(p, 'a'); f.write('x'); f.close(); n = os.path.getsize(p) - 1; "
         "bad = (mode == '1' and n > 4 and n % 5 == 0) or (mode == '2' and n >= 3); "
         "print('{{\"rate\": %f}}' % (100.0 * (1 + random.gauss(0, 0.005)))) if not bad else sys.exit(4)")


def _flaky_plan(tmp_path, mode: str):
    data = yaml.safe_load(PLAN.read_text())
    data["workload"] = {"command": ["{python}", "-c", FLAKY, str(tmp_path / "count"), "{n}"],
                        "metric": {"json_key": "rate", "unit": "runs/s"}, "timeout_s": 30, "warmup": 0,
                        "levels": [{"n": 1}, {"n": 2}]}  # fmt: skip
    data["environment"] = {"FLAKY": "0"}
    data["variants"] = [{**data["variants"][0], "env": {"FLAKY": mode}}]
    data["stats"].update(aa_rounds=8, quick_rounds=8, step_rounds=4, max_rounds=12)
    p = tmp_path / "flaky.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_a_command_that_fails_now_and_then_loses_those_samples_and_the_investigation_closes(tmp_path):
    env = replay_env(tmp_path, tmp_path / "state")
    r = kinv_in_process(env, "run", str(_flaky_plan(tmp_path, "1")), "--approval", "auto")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rep = json.loads(kinv_in_process(env, "report", "11a", "--json").stdout)
    t1 = next(e for e in rep["experiments"] if e["experiment"]["variant"] == "T1")
    assert t1["experiment"]["verdict"] in ("accept", "reject", "mixed", "inconclusive", "equivalent")
    rounds = t1["experiment"]["rounds"]
    assert any(v["n"] < rounds for v in t1["effects"])  # a lost round has no pair at its level
    text = (tmp_path / "state" / "reports" / "11a-closeout.md").read_text()
    assert "Lost samples: " in text and "the command exited 4" in text and "samples lost: " in text
    assert "(100.0 µs)" not in text and "time in the command's runs" in text  # the metric, not its reciprocal
    # the command checks itself wherever it runs: no claim that the check ran on the CPU, no empty backup path
    assert "correctness check at 2 levels (the command's own run)" in r.stdout and "levels (cpu)" not in r.stdout
    assert "no backup was needed (no file was patched)" in text and "backup kept at (" not in text


def test_a_command_that_keeps_failing_fails_its_variant_not_the_investigation(tmp_path):
    env = replay_env(tmp_path, tmp_path / "state")
    r = kinv_in_process(env, "run", str(_flaky_plan(tmp_path, "2")), "--approval", "auto")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    text = (tmp_path / "state" / "reports" / "11a-closeout.md").read_text()
    assert "T1 lost 3 of 3 samples at n1 (more than 25%)" in text, text


def test_the_env_check_reads_the_measured_process_itself(tmp_path):
    probe = ["{python}", "-c", "import os, json, time; time.sleep(0.3); "
             "print(json.dumps({{'gflops': 1.0, 'seen': os.environ['OMP_NUM_THREADS']}}))  # {n}"]  # fmt: skip
    plan, _ = load_plan(_plan_with(tmp_path, command=probe))
    be = get_backend("command")
    be.log_dir = tmp_path / "commands"
    be.preflight("command", plan.environment, plan.levels())
    arm = be.open("T1", "command", {"kernel": "command"}, plan.variant_env(plan.variants[0]))
    assert arm.env_seen == {"OMP_NUM_THREADS": "1"}  # read from /proc/<pid>/environ of that run
    log = (tmp_path / "commands" / "T1-n128-env.log").read_text()
    assert json.loads(log)["seen"] == "1"


def test_a_command_plan_with_a_bad_metric_is_refused_with_one_line(tmp_path):
    bad = _plan_with(tmp_path, metric={"regex": "no group", "unit": "x"})
    r = kinv_in_process(replay_env(tmp_path, tmp_path / "state"), "run", str(bad))
    assert r.returncode == 2 and "has no group" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "state" / "kinv.db").exists()


# the CPU matmul's investigation itself runs as the README shows it, on a fresh clone, in tests/test_readme.py


SERVER = '''
import http.server, json, os, sys, time, urllib.parse
work = int(os.environ["WORK"])
print("pid", os.getpid(), flush=True)
time.sleep(0.3)  # start-up: the probe must wait for it


class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        if url.path == "/ready":
            body = b"ok"
        else:
            n = int(urllib.parse.parse_qs(url.query)["n"][0])
            t0 = time.perf_counter()
            sum(i * i for i in range(n * work * 2000))
            dt = time.perf_counter() - t0
            body = json.dumps({"rate": n / dt, "work_us": dt * 1e6, "share": 0.5}).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)


http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''
CLIENT = ("import sys, urllib.request; "
          "print(urllib.request.urlopen('http://127.0.0.1:%s/step?n=%s' % (sys.argv[1], sys.argv[2])).read().decode())")


def _server_plan(tmp_path, restart="never"):
    (tmp_path / "server.py").write_text(SERVER)
    data = yaml.safe_load(PLAN.read_text())
    data["workload"] = {"command": ["{python}", "-c", CLIENT, "{port}", "{n}"],
                        "server": {"command": ["{python}", str(tmp_path / "server.py"), "{port}"],
                                   "ready_timeout_s": 30, "restart": restart},
                        "metric": {"json_key": "rate", "unit": "items/s", "also": ["work_us", "share"]},
                        "timeout_s": 30, "warmup": 1, "levels": [{"n": 1}, {"n": 2}]}  # fmt: skip
    data["environment"] = {"WORK": "1"}
    data["variants"] = [{**data["variants"][0], "title": "twice the work", "env": {"WORK": "2"}}]
    data["stats"].update(aa_rounds=8, quick_rounds=4, step_rounds=2, max_rounds=8)
    p = tmp_path / "server.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _pids(state):
    return [int(f.read_text().split()[1]) for f in sorted((state / "commands").glob("server-*.log"))]


def test_a_server_per_arm_is_started_in_its_environment_probed_kept_and_stopped(tmp_path):
    """The long-lived form: each arm's server starts in the arm's environment and answers a client per sample.  The
    check's server serves its arm's samples, the baseline's serves the A/A and the A/B, and none outlives the run."""
    import os

    env = replay_env(tmp_path, tmp_path / "state")
    r = kinv_in_process(env, "run", str(_server_plan(tmp_path)), "--approval", "auto")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rep = json.loads(kinv_in_process(env, "report", "11a", "--json").stdout)
    t1 = next(e for e in rep["experiments"] if e["experiment"]["variant"] == "T1")
    assert t1["experiment"]["verdict"] == "reject"  # twice the work halves the rate
    assert all(v["effect"] < -0.4 for v in t1["effects"])
    pids = _pids(tmp_path / "state")
    assert len(pids) == 3  # two A/A replicas of the baseline (one of them the check's) and the variant's
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    text = (tmp_path / "state" / "reports" / "11a-closeout.md").read_text()
    assert "WORK=2 in its processes (the baseline's: 1)" in text
    # what the server printed besides its metric, per arm: twice the work takes clearly longer (about twice as long
    # on an idle machine; up to four times seen while the rest of the suite loads both cores)
    row = next(ln for ln in text.splitlines() if ln.startswith("| n2 |") and "→" in ln)
    work = float(row.split("|")[3].split("(")[1].rstrip("%) "))  # columns: share, work_us (sorted)
    assert 40 < work < 500 and "0.5 → 0.5 (+0.0%)" in row, row
    assert "Environment expected and confirmed in every worker: WORK=1" in text


def test_a_server_that_never_gets_ready_fails_its_arm_with_one_line(tmp_path):
    plan = yaml.safe_load(_server_plan(tmp_path).read_text())
    plan["workload"]["server"].update(command=["{python}", "-c", "import time; time.sleep(60)  # {port}"],
                                      ready_timeout_s=1)  # fmt: skip
    (tmp_path / "never.yaml").write_text(yaml.safe_dump(plan))
    env = replay_env(tmp_path, tmp_path / "state")
    r = kinv_in_process(env, "run", str(tmp_path / "never.yaml"), "--approval", "auto")
    assert r.returncode != 0
    assert "the server was not ready at http://127.0.0.1:" in r.stderr and "within 1 s" in r.stderr, r.stderr


@pytest.mark.slow
def test_a_plan_may_restart_each_arms_server_before_every_round(tmp_path):
    env = replay_env(tmp_path, tmp_path / "state")
    r = kinv_in_process(env, "run", str(_server_plan(tmp_path, restart="round")), "--approval", "auto")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rep = json.loads(kinv_in_process(env, "report", "11a", "--json").stdout)
    rounds = sum(e["experiment"]["rounds"] or 0 for e in rep["experiments"])
    assert len(_pids(tmp_path / "state")) >= rounds  # a fresh server per arm per round (at least one per round)


# A command whose argument is its knob: --size N does N units of work, so a larger size is slower.
SIZED = ("import sys, json, time; n = int(sys.argv[2]); t0 = time.perf_counter(); sum(range(n * 2000)); "
         "print(json.dumps(dict(rate=1.0 / (time.perf_counter() - t0))))")


def test_a_variant_that_changes_a_command_argument_runs_that_command_line_and_closes_out(tmp_path):
    data = yaml.safe_load(PLAN.read_text())
    data["workload"] = {"command": ["{python}", "-c", SIZED, "--size", "{size}", "{n}"],
                        "args": {"size": "10"}, "metric": {"json_key": "rate", "unit": "runs/s"}, "timeout_s": 30,
                        "warmup": 0, "levels": [{"n": 1}]}  # fmt: skip
    data["environment"] = {}
    data["variants"] = [{"id": "S1", "title": "a larger size", "targets": "elsewhere", "args": {"size": "400"}}]
    data["stats"].update(aa_rounds=8, aa_arms=2, quick_rounds=4, step_rounds=2, max_rounds=6)
    plan = tmp_path / "sized.yaml"
    plan.write_text(yaml.safe_dump(data))
    env = replay_env(tmp_path, tmp_path / "state")
    r = kinv_in_process(env, "run", str(plan), "--approval", "ask")  # the approval shows the command line
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-2000:]
    pending = kinv_in_process(env, "pending").stdout
    assert "command line of S1's runs at n1: " in pending and "--size 10 1 -> " in pending
    assert pending.rstrip().count("--size 400 1") == 1
    kinv_in_process(env, "approve", "11a-S1-3")
    r = kinv_in_process(env, "resume", "11a")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    text = (tmp_path / "state" / "reports" / "11a-closeout.md").read_text()
    assert "- Command line of each arm at n1:" in text
    assert "--size 10 1`" in text and "S1: `" in text and "--size 400 1`" in text
    rep = json.loads(kinv_in_process(env, "report", "11a", "--json").stdout)
    s1 = next(e for e in rep["experiments"] if e["experiment"]["variant"] == "S1")
    assert s1["experiment"]["verdict"] == "reject"  # 40 times the work: slower beyond any noise


def test_an_argument_the_command_does_not_take_is_refused_in_one_line(tmp_path):
    data = yaml.safe_load(PLAN.read_text())
    data["variants"][0]["args"] = {"size": "4"}
    plan = tmp_path / "bad.yaml"
    plan.write_text(yaml.safe_dump(data))
    r = kinv_in_process(replay_env(tmp_path, tmp_path / "state"), "check", str(plan))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "variants.T1.args: 'size' is not an argument of this plan's command" in r.stderr


# Every run appends one byte to a tally (argv[1]) before printing its metric: the tally is the number of runs.
TALLY = ("import sys, random; f = open(sys.argv[1], 'a'); f.write('x'); f.close(); "
         "print('{{\"rate\": %f}}' % (100.0 * (1 + random.gauss(0, 0.002))))")


def test_every_runs_output_is_kept_across_variants_and_workstreams_and_show_names_where(tmp_path):
    tally = tmp_path / "tally"
    data = yaml.safe_load(PLAN.read_text())
    data["workload"] = {"command": ["{python}", "-c", TALLY, str(tally), "{n}"],
                        "metric": {"json_key": "rate", "unit": "runs/s"}, "timeout_s": 30, "warmup": 1,
                        "levels": [{"n": 1}]}  # fmt: skip
    data["variants"] = [{**data["variants"][0], "id": f"T{i}", "env": {"OMP_NUM_THREADS": str(i)}} for i in (1, 3)]
    data["stats"].update(aa_rounds=8, aa_arms=2, quick_rounds=2, step_rounds=2, max_rounds=4, threshold=0.5)
    env = replay_env(tmp_path, tmp_path / "state")
    for ws in ("#11a", "#11b"):  # two workstreams of one state dir, each with a baseline arm in every A/B
        data["workstream"]["id"] = ws
        plan = tmp_path / f"{ws[1:]}.yaml"
        plan.write_text(yaml.safe_dump(data))
        r = kinv_in_process(env, "run", str(plan), "--approval", "auto")
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    logs = sorted((tmp_path / "state" / "commands").glob("*.log"))
    assert len(logs) == len(tally.read_text())  # one file per run: none overwritten
    assert len({f.name for f in logs}) == len(logs) and all(f.name.startswith("e") for f in logs)
    shown = kinv_in_process(env, "show", "3").stdout  # #11a's T1: its runs, where they are
    assert f"{tmp_path / 'state' / 'commands'}/e3-*.log" in shown
    assert json.loads(kinv_in_process(env, "show", "3", "--json").stdout)["logs"]["files"] >= 3


def test_a_campaign_searches_a_command_argument_as_it_searches_the_environment(tmp_path):
    from kinv.kernels.adapter import get_adapter

    data = yaml.safe_load(PLAN.read_text())
    data["workload"]["command"] = ["{python}", "examples/cpu_matmul.py", "--n", "{n}", "--seconds", "{seconds}"]
    data["workload"]["args"] = {"seconds": "0.3"}
    data["backlog"] = [{"id": "DUR", "title": "run length", "rationale": "longer runs, less noise?",
                        "targets": "elsewhere", "args": {"seconds": ["0.1", "0.6"]}}]  # fmt: skip
    data["campaign"] = {"max_workstreams": 1}
    plan_path = tmp_path / "campaign.yaml"
    plan_path.write_text(yaml.safe_dump(data))
    plan, _ = load_plan(plan_path)
    item = plan.backlog[0]
    assert item.searchable and item.env == {"KINV_ARG_seconds": ["0.1", "0.6"]}  # screened as env values are
    level = plan.levels()[0]
    argv = get_adapter("command").argv(level, env={"KINV_ARG_seconds": "0.6"})
    assert argv[-4:] == ["--n", "128", "--seconds", "0.6"]  # a candidate's value reaches its runs' command line
    assert get_adapter("command").argv(level, env={})[-1] == "0.3"  # the incumbent's, from workload.args


def test_the_env_check_sees_a_command_that_ends_at_once_every_time(tmp_path):
    """A run of a few milliseconds (Python without site, as a tiny tool is): its environment reads empty while its
    exec completes and is gone once it ends; the check reads it in between, every time, and never reports a
    variable it could not see as unset."""
    quick = ["{python}", "-I", "-S", "-c", "print('{{\"gflops\": 1.0}}')  # {n}"]
    plan, _ = load_plan(_plan_with(tmp_path, command=quick))
    be = get_backend("command")
    be.log_dir = tmp_path / "commands"
    be.preflight("command", plan.environment, plan.levels())
    seen = [be.open(f"T{i}", "command", {"kernel": "command"}, {"OMP_NUM_THREADS": str(i)}).env_seen
            for i in range(1, 21)]  # fmt: skip
    assert seen == [{"OMP_NUM_THREADS": str(i)} for i in range(1, 21)]


def test_a_run_that_ended_before_its_environment_was_read_is_run_again_never_called_unset(tmp_path, monkeypatch):
    from kinv.agent.errors import VariantFailed
    from kinv.agent.tools.backends import command

    plan, _ = load_plan(_plan_with(tmp_path, command=["{python}", "-c", "print('{{\"gflops\": 1.0}}')  # {n}"]))
    be = get_backend("command")
    be.log_dir = tmp_path / "commands"
    be.preflight("command", plan.environment, plan.levels())
    real, calls = command._environ_of, []

    def first_unseen(proc, names):
        calls.append(proc.pid)
        return None if len(calls) == 1 else real(proc, names)

    monkeypatch.setattr(command, "_environ_of", first_unseen)
    assert be.open("T3", "command", {"kernel": "command"}, {"OMP_NUM_THREADS": "3"}).env_seen == {"OMP_NUM_THREADS": "3"}
    assert len(calls) == 2 and len(list((tmp_path / "commands").glob("T3-*-env*.log"))) == 2  # both runs kept
    monkeypatch.setattr(command, "_environ_of", lambda proc, names: None)
    with pytest.raises(VariantFailed) as e:
        be.open("T4", "command", {"kernel": "command"}, {"OMP_NUM_THREADS": "4"})
    assert "could not read the environment" in str(e.value) and "unset" not in str(e.value)
