"""Env checks: expected variables vs what a worker reported or a live process has."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kinv.agent.errors import EnvMismatch
from kinv.agent.store.db import Store
from kinv.agent.tools.backends.environ import proc_environ
from kinv.agent.tools.measure import envcheck
from kinv.agent.tools.measure.envcheck import Mismatch
from kinv.kernels.errors import BadInput

WS = "#3a"
EXPECTED = {"TARGET_CTAS": "512"}


@pytest.fixture
def store(state_dir):
    s = Store(state_dir)
    yield s
    s.close()


def test_compare():
    assert envcheck.compare(EXPECTED, {"TARGET_CTAS": "512", "OTHER": "x"}) == []
    assert envcheck.compare(EXPECTED, {"TARGET_CTAS": "256"}) == [Mismatch("TARGET_CTAS", "512", "256")]
    assert envcheck.compare(EXPECTED, {}) == [Mismatch("TARGET_CTAS", "512", None)]
    assert envcheck.compare(EXPECTED, {"TARGET_CTAS": None}) == [Mismatch("TARGET_CTAS", "512", None)]


def test_worker_match_is_recorded(store):
    exp = store.new_experiment(workstream=None, variant="baseline")
    row = envcheck.check_worker(store, None, exp, EXPECTED, {"TARGET_CTAS": "512"}, derived={"num_splits": 64})
    assert row["ok"] == 1 and row["source"] == "worker" and row["experiment"] == exp
    assert json.loads(row["seen"]) == {"TARGET_CTAS": "512"} and json.loads(row["expected"]) == EXPECTED
    assert json.loads(store.events()[-1]["data"])["derived"] == {"num_splits": 64}


def test_worker_mismatch_names_var_expected_and_seen(store):
    with pytest.raises(EnvMismatch) as err:
        envcheck.check_worker(store, WS, None, EXPECTED, {"TARGET_CTAS": "256"})
    assert str(err.value) == "env check failed: TARGET_CTAS expected '512', worker saw '256'"
    assert err.value.mismatches == [Mismatch("TARGET_CTAS", "512", "256")]
    (row,) = store.env_checks(WS)
    assert row["ok"] == 0 and "TARGET_CTAS" in row["mismatch"]


def test_worker_unset_var(store):
    with pytest.raises(EnvMismatch, match=r"^env check failed: TARGET_CTAS expected '512', worker saw unset$"):
        envcheck.check_worker(store, WS, None, EXPECTED, {"TARGET_CTAS": None})


def test_several_mismatches_stay_one_line(store):
    with pytest.raises(EnvMismatch) as err:
        envcheck.check_worker(store, WS, None, {**EXPECTED, "A": "1"}, {"A": "2"})
    assert "\n" not in str(err.value) and "TARGET_CTAS" in str(err.value) and "A expected '1'" in str(err.value)


def test_check_pid_reads_the_live_process(store):
    env = {"PATH": os.environ.get("PATH", ""), "TARGET_CTAS": "256"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"], env=env)
    try:
        assert proc_environ(proc.pid)["TARGET_CTAS"] == "256"
        with pytest.raises(EnvMismatch, match=f"TARGET_CTAS expected '512', pid {proc.pid} saw '256'"):
            envcheck.check_pid(store, WS, proc.pid, EXPECTED)
        assert envcheck.check_pid(store, WS, proc.pid, {"TARGET_CTAS": "256"})["source"] == f"pid:{proc.pid}"
        rows = store.env_checks(WS)
        assert [r["ok"] for r in rows] == [0, 1]
        assert "PATH" not in json.loads(rows[0]["seen"])  # only the expected vars are stored
    finally:
        proc.kill()
        proc.wait()


def test_nonexistent_pid_is_a_clear_error(store):
    pid = 2**22 + 12345  # above the kernel's pid_max
    with pytest.raises(BadInput, match=f"no process with pid {pid}"):
        envcheck.check_pid(store, WS, pid, EXPECTED)
    with pytest.raises(BadInput, match="pid=-1 is invalid"):
        proc_environ(-1)
    assert store.env_checks() == []
