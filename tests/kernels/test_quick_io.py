"""Inputs and outputs as kernels have them, through kinv.kernels.quick and the correctness gate: non-tensor inputs,
several outputs, each output's own dtype in the derived bytes, a reference that fails, the Triton interpreter's
known gaps named, a ``cpu_launch`` that works around them, and ``from_autotune`` levels beyond the autotune key."""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from kinv.agent.tools.worker import gate
from kinv.kernels import quick
from kinv.kernels.errors import BadInput

interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="a GPU is visible")
LEVELS = [{"N": 64}, {"N": 100}]


def _inputs(level, seed, device, dtype):
    g = torch.Generator().manual_seed(seed)
    return {"x": (torch.rand(level.N, generator=g) + 0.5).to(device=device, dtype=dtype), "eps": 1e-6,
            "acc_dtype": torch.float32, "mode": "rsqrt"}  # fmt: skip


def _reference(inputs):
    x = inputs["x"].to(inputs["acc_dtype"])
    return torch.rsqrt(x + inputs["eps"]), x * 2


def _torch_launch(inputs, p, out=None):
    x = inputs["x"].to(inputs["acc_dtype"])
    a, b = torch.rsqrt(x + inputs["eps"]).to(inputs["x"].dtype), (x * 2).to(torch.float32)
    if out is None:
        return a, b
    out[0].copy_(a)
    out[1].copy_(b)
    return out


def _adapter(name, **kw):
    cls = quick.kernel(name, tunables={"BLOCK": [64, 128]}, default={"BLOCK": 128}, levels=LEVELS,
                       make_inputs=kw.pop("make_inputs", _inputs), launch=kw.pop("launch", _torch_launch),
                       reference=kw.pop("reference", _reference), **kw)  # fmt: skip
    return cls()


def _check(adapter):
    return gate.check(
        adapter, {"kernel": adapter.name, "BLOCK": 128}, adapter.levels(None), seed=3, device="cpu"
    )


def test_non_tensor_inputs_pass_through_and_every_output_of_a_tuple_is_checked():
    adapter = _adapter("two_outputs")
    res = _check(adapter)
    assert res["ok"], res["reason"]

    def wrong_second(inputs, p, out=None):
        out = _torch_launch(inputs, p, out)
        out[1].add_(1)  # the second output is wrong: the gate says so
        return out

    res = _check(_adapter("two_outputs_bad", launch=wrong_second))
    assert not res["ok"] and "outputs outside atol" in res["reason"]


def test_an_error_inside_the_reference_says_reference_failed_not_launch_failed():
    def broken(inputs):
        raise RuntimeError("the reference's own bug")

    res = _check(_adapter("bad_reference", reference=broken))
    assert not res["ok"] and res["reason"].startswith("reference failed: RuntimeError: the reference's own bug")
    assert "launch failed" not in res["reason"]


def test_derived_bytes_count_each_output_in_its_own_dtype():
    level = _adapter("bytes_default").level({"N": 1000})
    timed = _adapter("bytes_default", dtype="bfloat16").bytes_moved(level)
    assert timed == 1000 * 2 + 1000 * 2 + 1000 * 2  # input bf16, both outputs assumed bf16
    own = _adapter("bytes_own", dtype="bfloat16", output_dtypes=["bfloat16", "float32"]).bytes_moved(level)
    assert own == 1000 * 2 + 1000 * 2 + 1000 * 4  # the second output is written in float32
    with pytest.raises(BadInput, match="output_dtypes names 1 dtype"):
        _adapter("bytes_bad", output_dtypes=["float32"]).bytes_moved(level)


@triton.jit
def _rsqrt_kernel(x_ptr, o_ptr, eps, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(o_ptr + offs, libdevice.rsqrt(x.to(tl.float32) + eps), mask=offs < n)


def _triton_launch(inputs, p, out=None):
    x = inputs["x"]
    out = torch.empty_like(x) if out is None else out
    _rsqrt_kernel[(triton.cdiv(x.numel(), p.BLOCK),)](x, out, inputs["eps"], x.numel(), BLOCK=p.BLOCK)
    return out


def _one_reference(inputs):
    return torch.rsqrt(inputs["x"].float() + inputs["eps"])


def _cpu_launch(inputs, p, out=None):  # the interpreter has no libdevice: the same math in torch, on CPU only
    r = torch.rsqrt(inputs["x"].float() + inputs["eps"]).to(inputs["x"].dtype)
    return r if out is None else out.copy_(r)


@interpreted
def test_a_launch_that_fails_in_the_interpreter_says_so_and_cpu_launch_works_around_it():
    levels = [{"N": 64}]
    plain = quick.kernel("rsqrt_plain", tunables={"BLOCK": [64]}, default={"BLOCK": 64}, levels=levels,
                         make_inputs=_inputs, launch=_triton_launch, reference=_one_reference)()  # fmt: skip
    res = gate.check(plain, {"kernel": plain.name, "BLOCK": 64}, plain.levels(None), seed=1, device="cpu")
    assert not res["ok"] and res["reason"].startswith("launch failed: InterpreterError")
    assert "in the Triton interpreter (CPU)" in res["reason"] and "likely a libdevice function" in res["reason"]
    assert "Python scalar" in res["reason"] and "bf16 tl.dot" in res["reason"] and "cpu_launch" in res["reason"]
    fixed = quick.kernel("rsqrt_cpu", tunables={"BLOCK": [64]}, default={"BLOCK": 64}, levels=levels,
                         make_inputs=_inputs, launch=_triton_launch, reference=_one_reference,
                         cpu_launch=_cpu_launch)()  # fmt: skip
    res = gate.check(fixed, {"kernel": fixed.name, "BLOCK": 64}, fixed.levels(None), seed=1, device="cpu")
    assert res["ok"], res["reason"]


@triton.autotune(configs=[triton.Config({"BLOCK": 32}, num_warps=4), triton.Config({"BLOCK": 64}, num_warps=4)],
                 key=["n"])  # fmt: skip
@triton.jit
def _scale_autotuned(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(o_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def test_from_autotune_levels_may_carry_dimensions_beyond_the_key_and_a_stand_in_shrinks_them():
    seen = []

    def make(level, seed, device, dtype):
        seen.append(dict(level.dims))
        return {"x": torch.randn(level.batch, level.n, device=device, dtype=dtype)}

    def launch(inputs, p, out=None):
        x = inputs["x"]
        out = torch.empty_like(x) if out is None else out
        _scale_autotuned[lambda m: (triton.cdiv(x.numel(), m["BLOCK"]),)](x, out, x.numel())
        return out

    cls = quick.from_autotune("scale_batched", _scale_autotuned, levels=[{"n": 4096, "batch": 64}, {"n": 64, "batch": 1}],
                              make_inputs=make, launch=launch, reference=lambda i: i["x"].float() * 2,
                              stand_in={"batch": 2, "n": 40})  # fmt: skip
    adapter = cls()
    assert adapter.level_dims == ("n", "batch")
    assert [lv.key for lv in adapter.levels(None)] == ["n4096/batch64", "n64/batch1"]
    assert adapter.stand_in(adapter.levels(None)[0], "cpu").dims == {"n": 40, "batch": 2}
    if os.environ.get("TRITON_INTERPRET") == "1":
        res = gate.check(adapter, {"kernel": adapter.name, **adapter._q.default}, adapter.levels(None)[:1],
                                seed=0, device="cpu")  # fmt: skip
        assert res["ok"], res["reason"]
        assert {"n": 40, "batch": 2} in seen  # the extra dimension reached make_inputs, shrunk
    with pytest.raises(BadInput, match="must name _scale_autotuned's autotune key"):
        quick.from_autotune("scale_bad", _scale_autotuned, levels=[{"batch": 2}], make_inputs=make, launch=launch,
                            reference=lambda i: i["x"])  # fmt: skip
