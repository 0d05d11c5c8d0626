"""Where the MLA decode kernel's time goes: stages, program count, the memory pattern alone.

    python benchmarks/lab/mla_anatomy.py --out benchmarks/results/mla_anatomy_h200.json [--part all]

At context 4096 the shipped kernel reaches 53-66% of copy bandwidth, at 16384 80-87%: the extra KV of the
longer context moves at the copy rate, so the gap is a cost that does not grow with the context.  This script
splits the time of one launch into its parts, each timed the way the worker times (a CUDA graph of many
launches cycling through input sets whose KV together exceeds 3x L2; ms per replay / launches):

* ``ctx``:    both stages, stage 1 alone, stage 2 alone, per context 1024..16384 (V3 and V4-Flash, batch 64);
              the intercept of stage 1 over the context is the cost per launch that does not scale;
* ``stream``: a kernel with stage 1's grid and loads that only sums the tiles (no dots, no softmax): the
              ceiling of the access pattern itself;
* ``splits``: stage 1 + 2 at V3/4096/b64 and b1 with the split count forced.
The first run (benchmarks/results/mla_anatomy_h200.json, kernel 6ec1a2667030) also timed a ``chunked`` part: stage 1
with the value columns in two halves, which became #9a's source patch (kernel 41cae75d46c1) and left this script.

Standard library, torch and triton only (runs on the GPU machine as it is).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kinv.kernels import mla_decode as K  # noqa: E402
from kinv.kernels.launch_config import LaunchParams  # noqa: E402
from kinv.kernels.mla_decode_adapter import mla_params  # noqa: E402
from kinv.kernels.mla_decode_ref import mla_decode_reference  # noqa: E402

SHAPES = {"v3": (576, 512), "v4flash": (512, 512)}
HEADS, PAGE = 16, 64
L2_BYTES = 50 * 2**20


def params(**kw) -> LaunchParams:
    base = {"BLOCK_T": 64, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2, "CTAS_PER_SM": 2}
    return mla_params(**{**base, **kw})


def make_inputs(shape, ctx, b, seed):
    d_qk, d_v = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages = math.ceil(ctx / PAGE)
    bt = torch.randperm(b * pages, generator=g, device="cuda").view(b, pages).to(torch.int32)
    kv = torch.randn((b * pages, PAGE, d_qk), generator=g, device="cuda").to(torch.bfloat16)
    q = torch.randn((b, HEADS, d_qk), generator=g, device="cuda").to(torch.bfloat16)
    lens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    return {"q": q, "kv": kv, "bt": bt, "lens": lens, "ctx": ctx, "d_v": d_v, "d_qk": d_qk}


def splits_for(inp, p):
    b = inp["q"].shape[0]
    return K.num_kv_splits(b, 1, inp["ctx"], p.BLOCK_T, ctas_per_sm=p.get("CTAS_PER_SM", 0))


def launch(inp, p, scratch, out, *, stage1=True, stage2=True, splits=None):
    """The shipped launch (the split merge as a second launch, MERGE 0), either stage alone."""
    q, kv, d_v, d_qk = inp["q"], inp["kv"], inp["d_v"], inp["d_qk"]
    b = q.shape[0]
    s = scratch["partial_o"].shape[2]
    rows = kv.view(-1, d_qk)
    use_tma = K._tma_ok(p, kv, d_v)
    desc = tail = rows
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        desc = TensorDescriptor.from_tensor(rows, [p.BLOCK_T, d_v // 2])
        tail = TensorDescriptor.from_tensor(rows, [p.BLOCK_T, max(16, d_qk - d_v)])
    po, pl = scratch["partial_o"], scratch["partial_lse"]
    if stage1:
        K._mla_decode_stage1[(b, 1, s)](
            q, rows, desc, tail, inp["bt"], inp["lens"], po, pl, out, scratch["counters"],
            HEADS, PAGE, d_qk ** -0.5 * K.LOG2E,
            q.stride(0), q.stride(1), rows.stride(0), inp["bt"].stride(0),
            po.stride(0), po.stride(1), po.stride(2), pl.stride(0), pl.stride(1), out.stride(0), out.stride(1),
            D_V=d_v, D_TAIL=d_qk - d_v, BLOCK_H=p.BLOCK_H, BLOCK_T=p.BLOCK_T, USE_TMA=use_tma, MERGE=False,
            num_warps=p.num_warps, num_stages=p.num_stages)  # fmt: skip
    if stage2:
        K._mla_decode_stage2[(b, HEADS, d_v // 128)](
            po, pl, out, s, po.stride(0), po.stride(1), po.stride(2), pl.stride(0), pl.stride(1),
            out.stride(0), out.stride(1), BLOCK_S=min(32, triton.next_power_of_2(s)), BLOCK_DV=128,
            num_warps=4, num_stages=1)  # fmt: skip


@triton.jit
def _stream_only(KV, BlockTable, SeqLens, Out, page_size, stride_kv_row, stride_bt_b,
                 D_V: tl.constexpr, D_TAIL: tl.constexpr, BLOCK_T: tl.constexpr):
    """Stage 1's grid and gathers, no dots: sums each tile's columns (so the loads are not dead)."""
    pid_b = tl.program_id(0)
    pid_s = tl.program_id(2)
    seq_len = tl.load(SeqLens + pid_b)
    n_tiles = tl.cdiv(seq_len, BLOCK_T)
    per = tl.cdiv(n_tiles, tl.num_programs(2))
    start = pid_s * per * BLOCK_T
    end = tl.minimum(start + per * BLOCK_T, seq_len)
    offs_tt = tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, D_V)
    offs_tail = D_V + tl.arange(0, D_TAIL if D_TAIL > 0 else 16)
    acc = tl.zeros([D_V], dtype=tl.float32)
    acc_t = tl.zeros([D_TAIL if D_TAIL > 0 else 16], dtype=tl.float32)
    bt_row = BlockTable + pid_b * stride_bt_b
    for t0 in range(start, end, BLOCK_T):
        offs_t = t0 + offs_tt
        page = tl.load(bt_row + offs_t // page_size)
        ptrs = KV + (page.to(tl.int64) * page_size + offs_t % page_size)[:, None] * stride_kv_row
        acc += tl.sum(tl.load(ptrs + offs_d[None, :]).to(tl.float32), axis=0)
        if D_TAIL > 0:
            acc_t += tl.sum(tl.load(ptrs + offs_tail[None, :]).to(tl.float32), axis=0)
    row = Out + (pid_b * tl.num_programs(2) + pid_s) * (D_V + D_TAIL)
    tl.store(row + offs_d, acc)
    if D_TAIL > 0:
        tl.store(row + offs_tail, acc_t)


def n_sets_for(inp):
    return max(2, math.ceil(3 * L2_BYTES / inp["kv"].nbytes))


def time_us(fn_per_set, n_sets, launches=None) -> float:
    """Median µs per launch of a CUDA graph of ``launches`` launches cycling ``n_sets`` input sets."""
    for j in range(n_sets):
        fn_per_set(j)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn_per_set(0)
    torch.cuda.synchronize()
    launches = launches or max(20, min(400, int(2e-3 / max(1e-6, time.perf_counter() - t0))))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(g, stream=stream):
        for i in range(launches):
            fn_per_set(i % n_sets)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        g.replay()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    vals = []
    for _ in range(5):
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        vals.append(e0.elapsed_time(e1) * 1e3 / launches)
    del g
    return statistics.median(vals)


class Case:
    """Input sets, scratch and outputs of one level at one split count."""

    def __init__(self, shape, ctx, b, p, splits=None):
        self.p = p
        first = make_inputs(shape, ctx, b, 0)
        self.sets = [first] + [make_inputs(shape, ctx, b, i) for i in range(1, n_sets_for(first))]
        self.splits = splits or splits_for(first, p)
        d_v = first["d_v"]
        self.scr = [K.mla_decode_scratch(b, HEADS, self.splits, d_v, "cuda") for _ in self.sets]
        self.out = [torch.empty((b, HEADS, d_v), dtype=torch.bfloat16, device="cuda") for _ in self.sets]
        self.kv_bytes = first["kv"].nbytes

    def t(self, **kw) -> float:
        return time_us(lambda j: launch(self.sets[j], self.p, self.scr[j], self.out[j], splits=self.splits, **kw),
                       len(self.sets))

    def check(self) -> float:
        inp = self.sets[0]
        launch(inp, self.p, self.scr[0], self.out[0])
        ref = mla_decode_reference(inp["q"], inp["kv"], inp["bt"], inp["lens"], d_v=inp["d_v"])
        return float((self.out[0].float() - ref.float()).abs().max())


def stream_us(sets, splits) -> float:
    """µs per launch of the access pattern alone (stage 1's grid and gathers, no dots) over ``sets``."""
    d_qk = sets[0]["d_qk"]
    sink = torch.empty((64 * splits, d_qk), dtype=torch.float32, device="cuda")

    def one(j):
        _stream_only[(64, 1, splits)](
            sets[j]["kv"].view(-1, d_qk), sets[j]["bt"], sets[j]["lens"], sink, PAGE, d_qk, sets[j]["bt"].stride(0),
            D_V=512, D_TAIL=d_qk - 512, BLOCK_T=64, num_warps=4, num_stages=3)  # fmt: skip

    return time_us(one, len(sets))


def part_ctx(rows, copy_gbps):
    for shape, p in (("v3", params()), ("v4flash", params(num_stages=3, TMA=1))):
        for ctx in (1024, 2048, 4096, 8192, 16384):
            c = Case(shape, ctx, 64, p)
            r = {"part": "ctx", "shape": shape, "ctx": ctx, "batch": 64, "splits": c.splits,
                 "both_us": c.t(), "stage1_us": c.t(stage2=False), "stage2_us": c.t(stage1=False)}
            r["pct_copy"] = 100 * c.kv_bytes / (r["both_us"] * 1e-6) / 1e9 / copy_gbps
            r["stage1_pct_copy"] = 100 * c.kv_bytes / (r["stage1_us"] * 1e-6) / 1e9 / copy_gbps
            # the pattern alone: the same grid and gathers, no dots
            r["stream_us"] = stream_us(c.sets, c.splits)
            r["stream_pct_copy"] = 100 * c.kv_bytes / (r["stream_us"] * 1e-6) / 1e9 / copy_gbps
            print(json.dumps(r), flush=True)
            rows.append(r)
            del c


def part_splits(rows, copy_gbps):
    for shape, b, p, choices in (("v3", 64, params(), (1, 2, 3, 4, 6, 8, 16)),
                                 ("v3", 1, params(num_warps=8, TMA=1), (8, 16, 32, 64)),
                                 ("v3", 1, params(BLOCK_T=32, num_warps=4, TMA=1), (16, 32, 64, 128)),
                                 ("v4flash", 1, params(num_warps=4, TMA=1), (8, 16, 32, 64))):
        for s in choices:
            c = Case(shape, 4096, b, p, splits=s)
            r = {"part": "splits", "shape": shape, "ctx": 4096, "batch": b, "config": p.short(),
                 "splits": s, "both_us": c.t(), "stage1_us": c.t(stage2=False), "stage2_us": c.t(stage1=False)}
            r["pct_copy"] = 100 * c.kv_bytes / (r["both_us"] * 1e-6) / 1e9 / copy_gbps
            print(json.dumps(r, default=str), flush=True)
            rows.append(r)
            del c


def copy_bandwidth() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    bb = torch.empty_like(a)
    us = time_us(lambda j: bb.copy_(a), 1, launches=20)
    return 2 * a.nbytes / (us * 1e-6) / 1e9


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--part", default="all", help="ctx, splits or all")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("mla_anatomy.py: no CUDA GPU; it times kernels and needs one", file=sys.stderr)
        return 2
    t0 = time.time()
    copy = copy_bandwidth()  # a plain 1 GiB device copy; the worker's copy_bandwidth (mla_ceiling.py) is the reference
    print(f"copy bandwidth {copy:.0f} GB/s", flush=True)
    rows: list[dict] = []
    parts = ("ctx", "splits") if args.part == "all" else (args.part,)
    try:
        for part in parts:
            {"ctx": part_ctx, "splits": part_splits}[part](rows, copy)
    finally:
        Path(args.out).write_text(json.dumps({"copy_gbps": copy, "rows": rows, "wall_s": time.time() - t0,
                                              "gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                                              "torch": torch.__version__}, indent=1, default=str))
    print(f"wall {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
