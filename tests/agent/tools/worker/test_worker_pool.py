"""Benchmark workers kept between arms: a later arm takes a worker only when everything its start fixed (the
environment, the import path in front of kinv, the kernel source on disk) is what the arm needs."""

from __future__ import annotations

import pytest

from kinv.agent.errors import WorkerError
from kinv.agent.tools.backends import cuda
from kinv.agent.tools.worker import pool as worker_pool
from kinv.agent.tools.worker.client import WorkerProcess
from kinv.agent.tools.worker.pool import WorkerPool, worker_key
from kinv.kernels.adapter import get_adapter
from tests.kernels.test_plugin import _write_package

PKG = "kinv_demo_matmul_pool"  # a plugin of this test's own: its source is edited below


def test_a_worker_is_kept_only_for_arms_with_its_environment_import_path_and_kernel_source(tmp_path, monkeypatch):
    src = _write_package(tmp_path, PKG)
    monkeypatch.syspath_prepend(str(src))
    kernel = f"{PKG}.adapter:TiledMatmulAdapter"
    get_adapter(kernel)
    base = worker_key(kernel, {"TARGET_CTAS": "512"}, None)
    assert worker_key(kernel, {"TARGET_CTAS": "512"}, None) == base
    assert worker_key(kernel, {"TARGET_CTAS": "1024"}, None) != base  # another environment: another process
    assert worker_key(kernel, {"TARGET_CTAS": "512"}, [str(tmp_path / "snapshot")]) != base  # a snapshot first
    (src / PKG / "kernel.py").write_text((src / PKG / "kernel.py").read_text() + "\nPATCHED = 1  # a source patch\n")
    assert worker_key(kernel, {"TARGET_CTAS": "512"}, None) != base  # the source changed since that worker began


def test_the_pool_hands_back_a_live_worker_under_its_own_key_only():
    pool = WorkerPool()
    a, b = WorkerProcess(label="a"), WorkerProcess(label="b")
    try:
        pool.give(("k1",), a)
        pool.give(("k2",), b)
        assert pool.take(("k3",)) is None
        assert pool.take(("k1",)) is a and pool.take(("k1",)) is None  # one arm at a time per worker
        b.proc.kill()
        b.proc.wait()
        assert pool.take(("k2",)) is None  # a worker that died while kept is never handed out
        assert pool.reused == 1
    finally:
        a.close()
        b.close()
        pool.close()


def test_the_pool_keeps_a_bounded_number_of_workers_and_stops_them_on_close(monkeypatch):
    monkeypatch.setattr(worker_pool, "MAX_IDLE", 2)
    pool = WorkerPool()
    workers = [WorkerProcess(label=f"w{i}") for i in range(3)]
    for i, w in enumerate(workers):
        pool.give((i,), w)
    assert workers[0].proc.poll() is not None  # the oldest is stopped beyond the bound
    assert all(w.proc.poll() is None for w in workers[1:])
    pool.close()
    assert all(w.proc.poll() is not None for w in workers)
    assert pool.take((1,)) is None


@pytest.mark.gpu
def test_arms_of_one_backend_reuse_a_worker_and_a_patched_source_gets_a_new_one(monkeypatch):
    from kinv.agent.tools.backends.cuda import CudaBackend
    from kinv.kernels.adapter import get_adapter

    monkeypatch.setattr(cuda, "POOL", WorkerPool())
    be = CudaBackend()
    level = get_adapter("mla_decode").level({"shape": "v4flash", "heads": 16, "page_size": 64, "context": 512,
                                              "batch": 1})  # fmt: skip
    cfg = {"kernel": "mla_decode", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}
    a = be.open("A", "mla_decode", cfg, {})
    a.setup(level)
    pid = a.worker_pid
    a.close()
    b = be.open("B", "mla_decode", {**cfg, "num_warps": 8}, {})
    assert b.worker_pid == pid and b.reused
    assert b.setup(level)["correct"]
    b.close()
    monkeypatch.setenv(worker_pool.REUSE_ENV, "0")
    c = CudaBackend().open("C", "mla_decode", cfg, {})
    assert c.worker_pid != pid and not c.reused
    c.close()
    be.close()


LEVEL = {"shape": "v4flash", "heads": 16, "page_size": 64, "context": 512, "batch": 1}
SEED_CFG = {"kernel": "mla_decode", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}


def test_a_worker_runs_the_correctness_gate_itself_and_refuses_a_bad_config_by_name():
    """The gate can run in the benchmark worker the arms then use (on CPU: the Triton interpreter); the worker
    launches and saves, and the judge, a process that never imported the kernel, compares."""
    from kinv.agent.tools.worker import judge

    with WorkerProcess(env={"TRITON_INTERPRET": "1"}, label="check") as w:
        launched = w.request("check", kernel="mla_decode", config=SEED_CFG, levels=[LEVEL], seed=11, device="cpu")
        assert launched["result"]["levels"][0]["ok"] is None  # not judged where the kernel ran
        ok = judge.settle("mla_decode", launched["result"])
        assert ok["ok"] and ok["device"] == "cpu" and ok["levels"][0]["mismatched"] == 0
        # BLOCK_H 24 is no power of two: the worker refuses the config by name and lives on for the next request
        with pytest.raises(WorkerError, match="BLOCK_H=24 is invalid"):
            w.request("check", kernel="mla_decode", config={**SEED_CFG, "BLOCK_H": 24}, levels=[LEVEL], seed=11,
                      device="cpu")  # fmt: skip
        assert w.proc.poll() is None


def test_a_request_that_outlives_its_timeout_kills_the_worker_and_says_so():
    from kinv.agent.errors import WorkerCrashed

    w = WorkerProcess(label="slow")
    try:
        with pytest.raises(WorkerCrashed, match=r"did not answer 'hello' within 0.001 s \(hang\?\)"):
            w.request("hello", timeout=0.001, env_keys=[])  # the worker is still importing: no answer in 1 ms
        assert w.proc.poll() is not None
    finally:
        w.close()


@pytest.mark.gpu
def test_the_cuda_gate_runs_in_the_worker_the_next_arm_takes_and_a_failed_check_keeps_none(monkeypatch):
    from kinv.agent.tools.backends.cuda import CudaBackend

    monkeypatch.setattr(cuda, "POOL", WorkerPool())
    be = CudaBackend()
    level = get_adapter("mla_decode").level(LEVEL)
    result = be.check("mla_decode", SEED_CFG, [level], seed=3, device="cuda", env={})
    assert result["ok"] and result["dtype"] == "bfloat16"
    assert be.pool.count(worker_key("mla_decode", {}, None)) == 1
    arm = be.open("A", "mla_decode", SEED_CFG, {})
    assert arm.reused and arm.setup(level)["correct"]
    arm.close()
    bad = be.check("mla_decode", {**SEED_CFG, "BLOCK_H": 24}, [level], seed=3, device="cuda", env={})
    assert not bad["ok"] and "BLOCK_H=24" in bad["reason"] and be.pool.count(worker_key("mla_decode", {}, None)) == 0
    be.close()


def test_an_arm_takes_a_worker_that_has_answered_before_one_still_starting():
    pool = WorkerPool()
    warm, used = WorkerProcess(label="warm"), WorkerProcess(label="check")
    try:
        pool.give(("k",), warm)  # started ahead of time, kept first
        pool.give(("k",), used)  # has run a check: ready now
        assert pool.take(("k",)) is used
        assert pool.take(("k",)) is warm
        assert pool.reused == 1  # a warm worker taken is a start, not a reuse
    finally:
        warm.close()
        used.close()
        pool.close()


def test_a_request_of_no_key_takes_the_last_kept_ready_worker_and_never_a_starting_one():
    pool = WorkerPool()
    warm, old, last = WorkerProcess(label="warm"), WorkerProcess(label="a"), WorkerProcess(label="b")
    try:
        pool.give(("k1",), old)
        pool.give(("k2",), last)
        pool.give(("k3",), warm)
        assert pool.take_any() == (("k2",), last)  # the one kept last, with its key to give it back under
        old.proc.kill()
        old.proc.wait()
        assert pool.take_any() is None  # the dead one is dropped; a warm one may still be importing torch
        assert pool.take(("k3",)) is warm
    finally:
        for w in (warm, old, last):
            w.close()
        pool.close()


@pytest.mark.gpu
def test_the_close_outs_copy_bandwidth_is_measured_in_a_kept_worker(monkeypatch):
    from kinv.agent.tools.backends.cuda import CudaBackend

    monkeypatch.setattr(cuda, "POOL", WorkerPool())
    be = CudaBackend()
    level = get_adapter("mla_decode").level(LEVEL)
    assert be.check("mla_decode", SEED_CFG, [level], seed=3, device="cuda", env={})["ok"]
    started = be.pool.started
    gbps = be.copy_bandwidth()
    assert 500 < gbps < 20000 and be.pool.started == started  # no new process
    assert be.pool.count(worker_key("mla_decode", {}, None)) == 1  # given back for the next arm
    be.close()


def test_the_cpu_checks_of_a_run_share_one_kept_checker_and_a_failed_check_keeps_none(monkeypatch):
    from kinv.agent.tools.backends.replay import ReplayBackend

    monkeypatch.setattr(worker_pool, "CHECKERS", WorkerPool())
    be = ReplayBackend()
    level = get_adapter("mla_decode").level({**LEVEL, "context": 40})
    first = be.check("mla_decode", SEED_CFG, [level], seed=1, device="cpu", env={"TARGET_CTAS": "64"})
    second = be.check("mla_decode", {**SEED_CFG, "num_warps": 8}, [level], seed=2, device="cpu",
                      env={"TARGET_CTAS": "64"})  # fmt: skip
    assert first["ok"] and second["ok"] and first["dtype"] == second["dtype"] == "float16"
    assert first["levels"][0]["seed"] != second["levels"][0]["seed"]  # each check draws inputs of its own
    pool = worker_pool.CHECKERS
    assert (pool.started, pool.reused) == (1, 1)  # the second check ran in the process the first left
    key = worker_key("mla_decode", {"TARGET_CTAS": "64", "TRITON_INTERPRET": "1"}, None)
    assert pool.count(key) == 1
    other = be.check("mla_decode", SEED_CFG, [level], seed=3, device="cpu", env={"TARGET_CTAS": "128"})
    assert other["ok"] and pool.started == 2  # another environment: a process of its own
    bad = be.check("mla_decode", {**SEED_CFG, "BLOCK_H": 24}, [level], seed=4, device="cpu", env={"TARGET_CTAS": "64"})
    assert not bad["ok"] and "BLOCK_H=24 is invalid" in bad["reason"]
    assert pool.count(key) == 0  # the process of a failed check is never kept
    be.close()
    assert pool.count(worker_key("mla_decode", {"TARGET_CTAS": "128", "TRITON_INTERPRET": "1"}, None)) == 0
