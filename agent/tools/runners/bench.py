"""Benchmarks: the backend a run uses (``bench.get_backend``, where a test can stand a backend in for
another) and ``kinv bench`` of a config.

The backends live in agent/tools/backends/ (one module each, registered by name: cuda, replay, and the Ray
executor's ray); the rounds, their order and seeds, the paired effects and the GPU-second ledger live in
agent/tools/measure/protocol.py.  Verdicts are decided only by the sequential A/B with
every rule (agent/tools/measure/sequential.py), which alone runs the round loop's A/B.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from kinv.agent.tools import backends
from kinv.agent.tools.backends.base import Backend
from kinv.agent.tools.measure.protocol import RoundLoop, sample_row
from kinv.agent.tools.worker.hashes import harness_hash, kernel_reference_hash
from kinv.kernels.adapter import Level, get_adapter
from kinv.kernels.launch_config import describe


def get_backend(name: str, kernel: str | None = None) -> Backend:
    """Resolve ``auto|cuda|replay`` (or any registered backend); auto says which it picked through ``.loud``.
    ``kernel``: the kernel it is for, so that a missing GPU is said in that kernel's terms (whether replay has
    recordings of it)."""
    from kinv.agent.errors import NoDevice

    try:
        return backends.get_backend(name)
    except NoDevice:
        if kernel is None:
            raise
        from kinv.agent.tools.backends.cuda import no_gpu

        raise NoDevice(no_gpu(kernel)) from None


def measure_config(store, exp_id, backend: Backend, kernel: str, config: dict, env: dict, levels: list[Level],
                   samples: int = 5, on_level: Callable | None = None) -> list[dict]:  # fmt: skip
    """``kinv bench`` of one config: per level µs, GB/s, fraction of copy bandwidth, throughput in the adapter's
    unit; all stored."""
    adapter = get_adapter(kernel)
    copy = backend.copy_bandwidth()
    hashes = (harness_hash(), kernel_reference_hash(kernel))
    arm = backend.open("config", kernel, config, env)
    device = store.device(arm.fingerprint) if arm.fingerprint else None
    out = []
    try:
        for level in levels:  # one level at a time: each is reported as it is done
            setup = arm.setup(level)
            rows, us = [], []

            def stored(rnd, level=level, rows=rows, us=us) -> None:
                s = rnd.got[level.key][0]
                us.append(s["us"])
                rows.append(sample_row(exp_id, arm, level, rnd.index, "A", s, backend.name, hashes, device))

            RoundLoop([arm], [level], sample_round=backend.sample_round).run(range(samples), stored)
            store.add_samples(rows)
            med = statistics.median(us)
            gbps = adapter.bytes_moved(level) / (med * 1e-6) / 1e9
            m = {"level": level.key, "config": describe(config), "us": med, "gbps": gbps,
                 "frac_copy": gbps / copy if copy else None, "throughput": adapter.throughput(level, med),
                 "throughput_unit": adapter.throughput_unit, "tflops": adapter.flops(level) / (med * 1e-6) / 1e12,
                 "copy_gbps": copy, "n": samples,
                 "cv": statistics.pstdev(us) / statistics.mean(us) if len(us) > 1 else 0.0,
                 "derived_env": setup.get("derived_env", {})}  # fmt: skip
            peer = adapter.peer(level, (arm.fingerprint or {}).get("gpu"))
            if peer:  # a reference figure of the kernel a user would pick instead (not measured here)
                m.update(peer=peer["peer"], peer_us=peer["us"], vs_peer=peer["us"] / med)
            store.add_measurements(exp_id, [{k: v for k, v in m.items() if k not in ("cv", "derived_env", "tflops", "peer", "peer_us", "vs_peer")}])
            out.append(m)
            if on_level:
                on_level(m)
    finally:
        arm.close()
    return out
