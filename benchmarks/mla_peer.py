"""kinv's MLA decode kernel beside the kernel a user would pick instead, the copy bandwidth and the batch-1 floor,
all in one run on one card.

    python benchmarks/mla_peer.py --peer-source .peer/triton_decode_attention.py --out results.json
    python benchmarks/mla_peer.py --peer-source ... --kinv-config extra.json --batches 1,8 --out ...  # screen configs
    python benchmarks/mla_peer.py --peer-source ... --plan plans/11-decode-b1-splits.yaml --no-peer ...  # its variants

The peer is vLLM's Triton grouped decode kernel in MLA mode (``triton_decode_attention.py``, Apache-2.0: its
``_fwd_grouped_kernel_stage1`` and ``_fwd_kernel_stage2``). Its source is not in this repository; pass the path of
a copy (vllm-project/vllm, ``vllm/attention/ops/triton_decode_attention.py``). It is run as written, with
``vllm.platforms`` answered by a stand-in that says "not ROCm", over its own space (BLOCK_N 16/32/64 x 4/8 warps x
1/2 stages) with the split count of vLLM's TARGET_CTAS=512 rule (``min(64, ceil(512 / batch))``); the best config
per level is the peer's figure.

The floor: one Triton grid that reads the batch-1 KV cache once (and writes one float per program), the least a
batch-1 launch can cost on this card.

Every arm is timed the same way: one CUDA graph of one launch per input set, enough sets that they do not fit in L2,
replayed; ``--rounds`` rounds, every arm once per round in turn; the median per arm. Each arm's output is checked
against kinv's reference on its first input set before it is timed. Needs a GPU; torch, triton and the standard
library only (it runs on the GPU machine as it is); the copy bandwidth is the benchmark worker's own measurement.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import statistics
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = ("v3", "v4flash")
CONTEXTS = (4096, 16384)
BATCHES = (1, 8, 32, 64, 96)
PEER_SPACE = list(itertools.product((16, 32, 64), (4, 8), (1, 2)))  # BLOCK_N, num_warps, num_stages


def peer_splits(batch: int) -> int:
    """vLLM's split count at TARGET_CTAS=512, one head tile of 16 heads: ceil(512 / batch), at most 64."""
    return min(64, math.ceil(512 / batch))


def load_peer(path: Path):
    """The peer's module, run as written; ``vllm.platforms.current_platform`` says this is not ROCm."""
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_rocm=lambda: False)
    sys.modules.setdefault("vllm", types.ModuleType("vllm"))
    sys.modules["vllm.platforms"] = platforms
    spec = importlib.util.spec_from_file_location("peer_triton_decode_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in ("_fwd_grouped_kernel_stage1", "_decode_softmax_reducev_fwd"):
        if not hasattr(module, name):
            raise SystemExit(f"--peer-source {path}: has no {name}; pass vLLM's triton_decode_attention.py")
    return module


def peer_launcher(peer, inputs: dict, block_n: int, warps: int, stages: int):
    """A function that runs the peer (both stages) on one input set into its own output."""
    import torch

    q, kv = inputs["q"], inputs["kv_cache"]
    b, h, d_qk = q.shape
    d_v = inputs["d_v"]
    k_buffer = kv.unsqueeze(2)  # [pages, page_size, 1 kv head, d_qk]: the layout the peer indexes
    v_buffer = k_buffer[..., :d_v]
    splits = peer_splits(b)
    logits = torch.empty((b, h, splits, d_v + 1), dtype=torch.float32, device=q.device)
    out = torch.empty((b, h, d_v), dtype=q.dtype, device=q.device)
    block_dmodel, block_dpe = (512, 64) if d_qk == 576 else (triton_next_pow2(d_qk), 0)

    def launch():
        peer._fwd_grouped_kernel_stage1[(b, 1, splits)](
            q, k_buffer, v_buffer, 1.0 / math.sqrt(d_qk), inputs["block_table"], inputs["seq_lens"], logits,
            inputs["block_table"].stride(0), q.stride(0), q.stride(1),
            k_buffer.stride(-3), k_buffer.stride(-2), v_buffer.stride(-3), v_buffer.stride(-2),
            logits.stride(0), logits.stride(1), logits.stride(2),
            kv_group_num=h, q_head_num=h, BLOCK_DMODEL=block_dmodel, BLOCK_DPE=block_dpe, BLOCK_DV=d_v,
            BLOCK_N=block_n, BLOCK_H=16, NUM_KV_SPLITS=splits, PAGE_SIZE=kv.shape[1], logit_cap=0.0,
            num_warps=warps, num_stages=stages, Lk=d_qk, Lv=d_v,
        )  # fmt: skip
        peer._decode_softmax_reducev_fwd(logits, q, out, v_buffer, inputs["seq_lens"], splits)
        return out

    return launch


def triton_next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def kinv_launcher(adapter, params, inputs: dict):
    out = adapter.make_output(inputs, params)
    scratch = adapter.make_scratch(inputs, params)

    def launch():
        return adapter.launch(inputs, params, out=out, scratch=scratch)[0]

    return launch


_FLOOR_BLOCK = 16384


def floor_launcher(kv_rows):
    """One grid that reads ``kv_rows`` (the batch-1 KV cache) once: each program sums _FLOOR_BLOCK elements."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _read_once(X, Out, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + offs, mask=offs < n, other=0.0)
        tl.store(Out + pid, tl.sum(x.to(tl.float32), axis=0))

    flat = kv_rows.reshape(-1)
    progs = triton.cdiv(flat.numel(), _FLOOR_BLOCK)
    out = torch.empty(progs, dtype=torch.float32, device=flat.device)

    def launch():
        _read_once[(progs,)](flat, out, flat.numel(), BLOCK=_FLOOR_BLOCK, num_warps=8)
        return out

    return launch


def rel_error(fns: list, ref) -> float:
    """Run every launch once (compiling it); the first one's largest error, relative to the reference's largest value."""
    import torch

    got = fns[0]().float()
    for fn in fns[1:]:
        fn()
    torch.cuda.synchronize()
    return ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()


def graph_us(launches: list, reps: int) -> float:
    """One CUDA graph of every launch (one per input set), replayed ``reps`` times: µs per launch."""
    import torch

    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for fn in launches:
            fn()
    g.replay()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        g.replay()
    e.record()
    torch.cuda.synchronize()
    del g
    return s.elapsed_time(e) * 1000 / (reps * len(launches))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer-source", required=True, help="vLLM's triton_decode_attention.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--kinv-config", action="append", default=[], help="a config file timed beside the shipped one")
    ap.add_argument("--plan", help="a plan whose variants' configs are timed beside the shipped file")
    ap.add_argument("--contexts", default="4096,16384")
    ap.add_argument("--batches", default="1,8,32,64,96")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-peer", action="store_true", help="time kinv's configs and the floor only")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("mla_peer.py needs a CUDA GPU; none is visible here", file=sys.stderr)
        return 2
    peer_path = Path(args.peer_source)
    if not peer_path.is_file():
        print(f"--peer-source {peer_path}: no such file; pass a copy of vLLM's triton_decode_attention.py",
              file=sys.stderr)  # fmt: skip
        return 2
    peer = load_peer(peer_path)

    from kinv.kernels.adapter import get_adapter

    adapter = get_adapter("mla_decode")
    configs = {"shipped": json.loads((ROOT / "kernels/configs/mla_decode.json").read_text())}
    for path in args.kinv_config:
        configs[Path(path).stem] = json.loads(Path(path).read_text())
    if args.plan:
        from kinv.agent.plan_file import load_plan

        plan, _ = load_plan(args.plan)
        configs.update({v.id: plan.variant_config(v) for v in plan.variants})
    configs = {name: adapter.validate_config(c) for name, c in configs.items()}
    contexts = [int(c) for c in args.contexts.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 * 2**20)
    t0 = time.time()
    from kinv.agent.tools.worker.bench_worker import Worker

    copy = Worker().copy_bandwidth({"mib": 2048})["gbps"]  # as kinv's roofline measures it
    print(f"# {props.name}  copy bandwidth {copy:.0f} GB/s  L2 {l2 / 2**20:.0f} MiB", flush=True)
    result = {"gpu": props.name, "copy_gbps": copy, "rounds": args.rounds, "peer_source": str(peer_path),
              "peer_space": PEER_SPACE, "configs": configs, "levels": [], "floor": {}}  # fmt: skip

    for shape, ctx, b in itertools.product(SHAPES, contexts, batches):
        level = adapter.level({"batch": b, "context": ctx, "shape": shape, "heads": 16, "page_size": 64})
        kv_bytes = b * ctx * (576 if shape == "v3" else 512) * 2
        sets = max(2, min(64, math.ceil(3 * l2 / kv_bytes)))
        inputs = [adapter.make_inputs(level, seed=11 + i) for i in range(sets)]
        ref = adapter.reference(inputs[0]).float()
        makers = {
            f"kinv:{name}": (lambda x, p=adapter.params_for(c, level): kinv_launcher(adapter, p, x))
            for name, c in configs.items()
        }
        if not args.no_peer:
            makers.update(
                {
                    f"peer:BN{bn}/w{w}/s{s}": (lambda x, bn=bn, w=w, s=s: peer_launcher(peer, x, bn, w, s))
                    for bn, w, s in PEER_SPACE
                }
            )
        arms: dict[str, list] = {}
        wrong: dict[str, float] = {}
        for name, make in makers.items():
            fns = [make(x) for x in inputs]
            err = rel_error(fns, ref)
            if not math.isfinite(err) or err > 2e-2:
                wrong[name] = err
            else:
                arms[name] = fns
        if b == 1 and shape == "v3":
            floor_inputs = [x["kv_cache"][x["block_table"][0].long()] for x in inputs]  # the request's pages, in order
            arms["floor"] = [floor_launcher(kv) for kv in floor_inputs]
            for fn in arms["floor"]:
                fn()
        torch.cuda.synchronize()
        per_replay_s = sets * max(kv_bytes / (copy * 1e9), 10e-6)  # a replay's rough length: 2 ms of replays
        reps = max(3, min(200, math.ceil(2e-3 / per_replay_s)))
        times: dict[str, list[float]] = {name: [] for name in arms}
        for _ in range(args.rounds):
            for name, fns in arms.items():
                times[name].append(graph_us(fns, reps))
        med = {name: statistics.median(v) for name, v in times.items()}
        peers = {k: v for k, v in med.items() if k.startswith("peer:")}
        best_peer = min(peers, key=peers.get) if peers else None
        row = {"shape": shape, "context": ctx, "batch": b, "sets": sets, "reps": reps, "kv_bytes": kv_bytes,
               "us": med, "samples_us": times, "incorrect": wrong, "best_peer": best_peer,
               "pct_copy": {k: 100 * kv_bytes / (v * 1e-6) / 1e9 / copy for k, v in med.items()}}  # fmt: skip
        if "floor" in med:
            result["floor"][str(ctx)] = med.pop("floor")
            row["us"] = med
        result["levels"].append(row)
        kinv_us = med.get("kinv:shipped", float("nan"))
        line = (
            f"{shape:8s} ctx{ctx:6d} b{b:3d} shipped {kinv_us:8.1f} us {row['pct_copy'].get('kinv:shipped', 0):5.1f}%"
        )
        for name in configs:
            if name != "shipped" and f"kinv:{name}" in med:
                line += f"  {name} {med[f'kinv:{name}']:8.1f} us"
        if best_peer:
            line += f"  peer {peers[best_peer]:8.1f} us ({best_peer[5:]}) peer/kinv {peers[best_peer] / kinv_us:.2f}x"
        if str(ctx) in result["floor"] and b == 1:
            line += f"  floor {result['floor'][str(ctx)]:.2f} us"
        if wrong:
            line += f"  incorrect: {', '.join(f'{k} {v:.1e}' for k, v in wrong.items())}"
        print(line, flush=True)
        del inputs, arms
        torch.cuda.empty_cache()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    result["wall_s"] = time.time() - t0
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(table(result))
    print(f"# wrote {args.out} in {result['wall_s']:.0f} s")
    return 0


def table(result: dict) -> str:
    """The goal's table: µs at batch 1 (and its ratio to the floor), % of copy bandwidth elsewhere; peer ÷ kinv."""
    rows = {}
    ratio: dict[int, list[float]] = {}
    for r in result["levels"]:
        us = r["us"].get("kinv:shipped")
        if us is None:
            continue
        key = (r["shape"], r["context"])
        if r["batch"] == 1:
            fl = result["floor"].get(str(r["context"]))
            cell = f"{us:.1f} µs" + (f" ({us / fl:.1f}x floor)" if fl else "")
        else:
            cell = f"{r['pct_copy']['kinv:shipped']:.1f}%"
        rows.setdefault(key, {})[r["batch"]] = cell
        if r["best_peer"]:
            ratio.setdefault(r["batch"], []).append(r["us"][r["best_peer"]] / us)
    batches = sorted({b for v in rows.values() for b in v})
    out = ["| shape, context | " + " | ".join(f"b{b}" for b in batches) + " |",
           "| --- |" + " --- |" * len(batches)]  # fmt: skip
    for (shape, ctx), cells in rows.items():
        name = {"v3": "V3", "v4flash": "V4-Flash"}[shape]
        out.append(f"| {name}, {ctx} | " + " | ".join(cells.get(b, "") for b in batches) + " |")
    if ratio:
        out.append(
            "| peer best ÷ kinv | "
            + " | ".join(f"{min(ratio[b]):.2f}-{max(ratio[b]):.2f}×" if b in ratio else "" for b in batches)
            + " |"
        )
    floors = ", ".join(f"{c}: {v:.2f} µs" for c, v in result["floor"].items())
    return "\n".join(out) + f"\n\ncopy {result['copy_gbps']:.0f} GB/s on {result['gpu']}; batch-1 floor {floors}"


if __name__ == "__main__":
    sys.exit(main())
