"""Nothing else on the GPU while an arm is timed: the other processes kinv started are stopped, and what NVML
sees beside the timed worker is named."""

from __future__ import annotations

import subprocess
import sys
import time

from kinv.agent.tools.measure.sequential import foreign_flags
from kinv.agent.tools.worker import neighbours


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def test_the_other_workers_and_their_children_are_stopped_while_an_arm_is_timed_and_go_on_after():
    # a "worker" that started a child of its own: both must stop (the child could run GPU work of its own)
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    leader = subprocess.Popen([sys.executable, "-c", code], process_group=0)
    try:
        time.sleep(1.0)
        child = int(subprocess.run(["pgrep", "-P", str(leader.pid)], capture_output=True, text=True).stdout.split()[0])
        with neighbours.paused([leader.pid]) as stopped:
            time.sleep(0.2)
            assert stopped == [leader.pid]
            assert _state(leader.pid) == "T" and _state(child) == "T"
        time.sleep(0.2)
        assert _state(leader.pid) != "T" and _state(child) != "T"
    finally:
        import os
        import signal

        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def test_a_group_already_gone_is_skipped_and_an_error_in_the_block_still_continues_the_others():
    leader = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], process_group=0)
    try:
        try:
            with neighbours.paused([leader.pid, 999_999_999]) as stopped:
                assert stopped == [leader.pid]
                raise RuntimeError("the sample failed")
        except RuntimeError:
            pass
        time.sleep(0.1)
        assert _state(leader.pid) != "T"
    finally:
        leader.kill()
        leader.wait()


def test_other_gpu_work_is_named_whether_or_not_nvml_reports_the_timed_workers_own_pid():
    assert neighbours.foreign(None, 10) == ""  # NVML cannot say: nothing is claimed
    assert neighbours.foreign({10: 90}, 10) == ""  # only the timed worker ran
    assert neighbours.foreign({10: 90, 77: 40}, 10) == "other GPU work during the sample: pid 77 at 40% SM"
    # a container's pids differ from the host's NVML reports: two active processes are one too many
    assert "pid 5 at 30% SM" in neighbours.foreign({4: 95, 5: 30}, 10)
    assert neighbours.foreign({4: 95}, 10) == ""


def test_without_nvml_the_watch_says_why_and_claims_nothing():
    w = neighbours.Watch()
    if not w.available:
        assert w.why.startswith("NVML not available") and w.active(0) is None


def test_a_level_with_a_sample_timed_beside_other_gpu_work_is_flagged_by_name():
    samples = [{"level": "b1", "arm": "A", "round": 0, "foreign": None},
               {"level": "b8", "arm": "B", "round": 3, "foreign": "other GPU work during the sample: pid 7 at 50% SM"}]
    flags = foreign_flags(samples, {"A": "baseline", "B": "V1"})
    assert list(flags) == ["b8"]
    assert "the V1 arm's round 4 was timed beside other work on the GPU (other GPU work" in flags["b8"]
