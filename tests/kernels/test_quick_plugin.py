"""A plugin in minutes: kinv.kernels.quick builds a whole KernelAdapter from declarations.

The example plugin (examples/quick_matmul: a Triton tiled matmul, its adapter through ``quick.kernel``
and the same kernel through ``quick.from_autotune``) is checked here for its size, its derived members, its
restrictions, its correctness gate in the Triton interpreter, and end to end: built into a temporary folder with
``pip install --target`` (never into the shared venv), found by its entry points through PYTHONPATH, and run with
``kinv run --backend replay`` from a recording it ships in its own package.  That recording is a synthetic fixture
(its header says so, and so does the replay banner): the point is the plumbing, not the numbers.
"""

from __future__ import annotations

import builtins
import gzip
import importlib
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from kinv.kernels.errors import BadInput
from tests.utils import run_kinv

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "quick_matmul"
PKG = "kinv_quick_matmul"
REF = f"{PKG}.adapter:QuickMatmul"
AUTOTUNE_REF = f"{PKG}.adapter_autotune:QuickMatmulAutotune"
interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="a GPU is visible: Triton kernels are not interpreted")


def _code_lines(path: Path) -> int:
    """Lines that are neither blank nor comments (a docstring's lines count)."""
    return sum(1 for ln in path.read_text().splitlines() if ln.strip() and not ln.strip().startswith("#"))


def _copy_example(dest: Path) -> Path:
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("__pycache__", "recordings", "*.egg-info", "build"))
    return dest


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """A copy of the example package, importable in this process (what a test writes there stays out of the repo)."""
    src = _copy_example(tmp_path_factory.mktemp("quick") / "quick_matmul")
    sys.path.insert(0, str(src))
    try:
        yield src
    finally:
        sys.path.remove(str(src))


def _adapter(ref: str = REF):
    from kinv.kernels.adapter import get_adapter

    return get_adapter(ref)


def _module():
    return importlib.import_module(f"{PKG}.adapter")


# --------------------------------------------------------------------------- #
# (a) the size of the example
# --------------------------------------------------------------------------- #
def test_the_example_adapter_module_is_at_most_40_lines_of_code():
    # counted: every line of kinv_quick_matmul/adapter.py that is not blank and not a comment (its docstring, imports,
    # the three functions and the quick.kernel call); the Triton kernel lives in kernel.py and is not counted
    assert _code_lines(EXAMPLE / PKG / "adapter.py") <= 40
    assert _code_lines(EXAMPLE / PKG / "adapter_autotune.py") <= 40


# --------------------------------------------------------------------------- #
# what quick derives
# --------------------------------------------------------------------------- #
def test_the_quick_adapter_derives_its_members_from_the_declarations(example):
    from kinv.kernels.adapter import KernelAdapter

    a = _adapter()
    assert isinstance(a, KernelAdapter) and a.name == "quick_matmul" and type(a).__module__ == f"{PKG}.adapter"
    assert [(t.name, t.values, t.abbr) for t in a.spec.tunables] == [
        ("TILE_M", (32, 64, 128), "TM"), ("TILE_N", (32, 64, 128), "TN"), ("TILE_K", (32, 64), "TK"),
        ("num_warps", (4, 8), "w"), ("num_stages", (2, 3, 4), "s")]  # fmt: skip
    assert a.level_dims == ("M", "N", "K") and a.throughput_unit == "TFLOP/s" and a.resource_model is False
    # the plugin's own files, relative to its root: what a source patch may change, and what the hashes cover
    assert a.root() == example and a.package_name() == PKG
    assert a.kernel_files == (f"{PKG}/kernel.py", f"{PKG}/adapter.py")
    assert a.reference_parts == ((f"{PKG}/adapter.py", "reference"), (f"{PKG}/adapter.py", "flops"),
                                 (f"{PKG}/adapter.py", "make_inputs"))  # fmt: skip
    assert a.config_path() == example / PKG / "configs" / "quick_matmul.json"
    levels = a.levels(a.workload_model().model_validate({}))
    assert [lv.key for lv in levels] == ["M512/N512/K512", "M2048/N2048/K2048", "M128/N4096/K4096"]
    lv = levels[0]
    assert a.bytes_moved(lv) == 2 * (512 * 512 * 3)  # two fp16 inputs and the fp16 output, derived
    assert a.flops(lv) == 2 * 512**3 and a.throughput(lv, 1.0) == pytest.approx(2 * 512**3 / 1e-6 / 1e12)
    assert any("derived by kinv" in n for n in a.workload_notes(None, {}))
    assert a.stand_in(lv, "cpu").key == "M64/N64/K64" and a.stand_in(lv, "cuda") is lv


def test_a_plan_picks_declared_levels_by_label_or_gives_its_own_and_a_wrong_one_is_named(example):
    from pydantic import ValidationError

    a = _adapter()
    model = a.workload_model()
    got = a.levels(model.model_validate({"levels": ["M2048/N2048/K2048", {"M": 256, "N": 128, "K": 64}]}))
    assert [lv.key for lv in got] == ["M2048/N2048/K2048", "M256/N128/K64"]
    for bad, said in (({"levels": ["M3/N3/K3"]}, "not a declared level"), ({"levels": [{"M": 1, "N": 2}]}, "dimensions M, N, K"),
                      ({"levels": [{"M": "x", "N": 2, "K": 3}]}, "M="), ({"sizes": []}, "sizes")):  # fmt: skip
        with pytest.raises(ValidationError) as err:
            model.model_validate(bad)
        assert said in str(err.value), str(err.value)


def test_labels_are_the_dimensions_that_vary_between_the_declared_levels(example):
    from kinv.kernels import quick

    m = _module()
    cls = quick.kernel("quick_label", tunables={"T": [16]}, default={"T": 16}, module=f"{PKG}.adapter",
                       levels=[{"M": 64, "N": 32, "K": 16}, {"M": 128, "N": 32, "K": 16}],
                       make_inputs=m.make_inputs, launch=m.launch, reference=m.reference)  # fmt: skip
    a = cls()
    assert [lv.label for lv in a.levels(a.workload_model().model_validate({}))] == ["M64", "M128"]
    assert a.level({"M": 64, "N": 48, "K": 16}).label == "M64/N48"  # a plan's own level shows what differs
    assert a.throughput_unit == "GB/s"  # no flops declared: throughput of the derived bytes


def test_a_missing_config_file_is_written_from_the_declared_default_by_a_run_only(example, monkeypatch, tmp_path):
    from kinv.kernels.launch_config import load_config

    monkeypatch.setenv("KINV_CONFIG_DIR", str(tmp_path / "configs"))
    a = _adapter()
    path = a.config_path()  # what listing and checking ask: nothing written
    assert path == tmp_path / "configs" / "quick_matmul.json" and not path.exists()
    assert a.ensure_config() == path and path.is_file()  # what a run asks
    assert load_config(path, REF) == {"kernel": "quick_matmul", "TILE_M": 64, "TILE_N": 64, "TILE_K": 32,
                                      "num_warps": 4, "num_stages": 2}  # fmt: skip


def test_resources_come_from_the_compiled_kernel_and_without_one_nothing_is_modelled(example):
    from kinv.agent.tools.backends.compiled import compiled_figures
    from kinv.kernels.devices import get_device

    a = _adapter()
    lv = a.level({"M": 512, "N": 512, "K": 512})
    p = a.params_for(a.validate_config({"kernel": "quick_matmul", "TILE_M": 64, "TILE_N": 64, "TILE_K": 32,
                                        "num_warps": 4, "num_stages": 2}), lv)  # fmt: skip
    bare = a.resources(p, lv, get_device("sm_90"))
    assert bare.smem_estimate == 0 and bare.smem_compiled is None and bare.occupancy == {} and bare.feasible
    assert compiled_figures(bare.to_dict()) is None
    compiled = SimpleNamespace(metadata=SimpleNamespace(shared=49152, num_warps=4), n_regs=168, n_spills=0)
    res = a.resources(p, lv, get_device("sm_90"), compiled)
    assert (res.smem_compiled, res.registers, res.spills) == (49152, 168, 0)
    assert res.occupancy["limited_by"] == "registers" and res.occupancy["ctas_per_sm"] == 3
    figs = compiled_figures(res.to_dict())
    assert figs["registers"] == 168 and figs["smem"] == 49152 and figs["ctas_per_sm"] == 3
    big = a.resources(p, lv, get_device("sm_120"), SimpleNamespace(metadata=SimpleNamespace(shared=200_000), n_regs=64,
                                                                   n_spills=0))  # fmt: skip
    assert not big.feasible and "shared memory" in big.reason


class _FakeKernel:
    """Launched like a Triton kernel (``k[grid](...)``); returns a compiled-kernel stand-in with metadata."""

    def __init__(self):
        self.fn = _fake_body
        self.compiled = SimpleNamespace(metadata=SimpleNamespace(shared=1024, num_warps=4), n_regs=32, n_spills=0)

    def run(self, *args, grid, warmup, **kwargs):
        args[-1].copy_(args[0] + 1)
        return self.compiled

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=False, **kwargs)


def _fake_body(x, out):
    pass


FAKE = _FakeKernel()


def _fake_launch(inputs, p, out=None):
    out = inputs["x"].new_empty(inputs["x"].shape) if out is None else out
    FAKE[(1,)](inputs["x"], out, BLOCK=p.BLOCK)
    return out


def test_the_compiled_kernel_of_a_launch_is_captured_from_the_triton_kernels_launch_names(example):
    import torch

    from kinv.kernels import quick

    cls = quick.kernel("quick_fake", tunables={"BLOCK": [1]}, default={"BLOCK": 1}, levels=[{"n": 8}],
                       make_inputs=lambda level, seed, device, dtype: {"x": torch.zeros(level.n, dtype=dtype)},
                       launch=_fake_launch, reference=lambda inputs: inputs["x"].float() + 1,
                       module=f"{PKG}.adapter")  # fmt: skip
    a = cls()
    lv = a.level({"n": 8})
    inputs = a.make_inputs(lv, 0, "cpu")
    out, compiled = a.launch(inputs, a.params_for(a.validate_config({"kernel": "quick_fake", "BLOCK": 1}), lv))
    assert compiled is FAKE.compiled and torch.equal(out, torch.ones(8, dtype=torch.float16))
    buffer = torch.full((8,), float("nan"), dtype=torch.float16)
    assert a.launch(inputs, a.params_for({"BLOCK": 1}, lv), out=buffer)[0] is buffer


# --------------------------------------------------------------------------- #
# (b) restrictions: parsed, evaluated without eval, refused with one message
# --------------------------------------------------------------------------- #
NAMES = ("TILE_M", "TILE_N", "num_warps")


def test_restriction_strings_are_evaluated_over_the_tunables_without_eval(monkeypatch):
    from kinv.kernels import quick
    from kinv.kernels.errors import ConfigError
    from kinv.kernels.tunables import Tunable, TunableSpec

    def no_eval(*a, **k):
        raise AssertionError("eval must never be called")

    monkeypatch.setattr(builtins, "eval", no_eval)
    cases = {"TILE_M * TILE_N <= 2048 * num_warps": [True, False], "32 <= TILE_M < TILE_N": [False, False],
             "TILE_M % 32 == 0 and not TILE_N // TILE_M > 2": [True, True], "TILE_M / 0 > 1": [False, False],
             "num_warps == 4 or TILE_M - TILE_N >= 0": [True, True]}  # fmt: skip
    values = [{"TILE_M": 64, "TILE_N": 64, "num_warps": 4}, {"TILE_M": 128, "TILE_N": 128, "num_warps": 4}]
    for text, want in cases.items():
        r = quick.restriction(text, NAMES)
        spec = TunableSpec("k", tuple(Tunable(n, (4, 64, 128), n) for n in NAMES), (r,))
        got = []
        for v in values:
            try:
                spec.check_restrictions(v)
                got.append(True)
            except ConfigError as exc:
                assert text in str(exc)
                got.append(False)
        assert got == want, text
    fn = quick.restriction(lambda v: v["TILE_M"] <= v["TILE_N"], NAMES)
    assert fn.check({"TILE_M": 32, "TILE_N": 64}) and not fn.check({"TILE_M": 64, "TILE_N": 32})
    assert quick.restriction(("square tiles", lambda v: v["TILE_M"] == v["TILE_N"]), NAMES).text == "square tiles"


@pytest.mark.parametrize("text, what", [
    ("TILE_Q * TILE_N <= 16384", "it names TILE_Q, which is not a tunable"),
    ("abs(TILE_M) <= 64", "it uses a call"),
    ("__import__('os').system('true') == 0", "it uses a call"),
    ("TILE_M <= os.sep", "it uses an attribute"),
    ("TILE_M ** 2 <= 4096", "it uses the power operator **"),
    ("TILE_M in (32, 64)", "it uses 'in'"),
    ("TILE_M <= 'x'", "the constant 'x'"),
    ("TILE_M * TILE_N", "it is not a condition"),
    ("TILE_M <=", "it is not an expression"),
])  # fmt: skip
def test_a_restriction_beyond_names_numbers_arithmetic_comparisons_is_refused_in_one_message(text, what):
    from kinv.kernels import quick

    with pytest.raises(BadInput) as err:
        quick.restriction(text, NAMES)
    said = str(err.value)
    assert len(said.splitlines()) == 1 and f"restriction {text!r} is refused" in said and what in said, said
    assert "only tunable names (TILE_M, TILE_N, num_warps), numbers, arithmetic" in said, said


def test_a_declaration_with_a_bad_restriction_or_default_fails_naming_it(example):
    from kinv.kernels import quick

    m = _module()
    base = dict(tunables={"TILE_M": [32, 64]}, default={"TILE_M": 32}, levels=[{"M": 8}], make_inputs=m.make_inputs,
                launch=m.launch, reference=m.reference, module=f"{PKG}.adapter")  # fmt: skip
    with pytest.raises(BadInput, match="names TILE_N, which is not a tunable"):
        quick.kernel("bad_rule", restrictions=["TILE_M <= TILE_N"], **base)
    with pytest.raises(BadInput, match=r"default: TILE_M=48 is invalid"):
        quick.kernel("bad_default", **{**base, "default": {"TILE_M": 48}})
    with pytest.raises(BadInput, match="levels\\[1\\] must have the dimensions"):
        quick.kernel("bad_levels", **{**base, "levels": [{"M": 8}, {"N": 8}]})
    with pytest.raises(BadInput, match="launch must take 3 arguments"):
        quick.kernel("bad_launch", **{**base, "launch": lambda inputs, p: None})


# --------------------------------------------------------------------------- #
# (c) the correctness gate on CPU, in the Triton interpreter
# --------------------------------------------------------------------------- #
def _config(**kw) -> dict:
    return {"kernel": "quick_matmul", "TILE_M": 64, "TILE_N": 64, "TILE_K": 32, "num_warps": 4, "num_stages": 2, **kw}


@interpreted
def test_the_example_passes_the_correctness_gate_in_the_interpreter_in_float16(example):
    from kinv.agent.tools.worker.gate import check

    a = _adapter()
    levels = a.levels(a.workload_model().model_validate({}))
    res = check(a, _config(TILE_N=128, TILE_K=64), levels, seed=3, device="cpu")
    assert res["ok"] and res["dtype"] == "float16", res
    assert [e["ran"] for e in res["levels"]] == ["M64/N64/K64"] * 3  # the capped stand-in, launched once
    assert [e.get("same_as") for e in res["levels"]] == [None, "M512/N512/K512", "M512/N512/K512"]


@interpreted
def test_a_float32_quick_adapter_passes_and_a_wrong_or_careless_launch_fails_the_gate(example):
    from kinv.agent.tools.worker.gate import check
    from kinv.kernels import quick

    m = _module()
    decl = dict(tunables={"TILE_M": [32], "TILE_N": [32], "TILE_K": [32], "num_warps": [4], "num_stages": [2]},
                default={"TILE_M": 32, "TILE_N": 32, "TILE_K": 32, "num_warps": 4, "num_stages": 2},
                levels=[{"M": 40, "N": 72, "K": 48}], make_inputs=m.make_inputs, reference=m.reference,
                module=f"{PKG}.adapter")  # fmt: skip
    cfg = {"TILE_M": 32, "TILE_N": 32, "TILE_K": 32, "num_warps": 4, "num_stages": 2}

    def run(name, launch, **kw):
        a = quick.kernel(name, launch=launch, **decl, **kw)()
        return check(a, {"kernel": name, **cfg}, a.levels(a.workload_model().model_validate({})), seed=5, device="cpu")

    res = run("quick_fp32", m.launch, dtype="float32")
    assert res["ok"] and res["dtype"] == "float32" and res["levels"][0]["max_abs_err"] < 1e-3, res

    def off_by_some(inputs, p, out=None):
        return m.launch(inputs, p, out).mul_(1.05)

    res = run("quick_wrong", off_by_some)
    assert not res["ok"] and "outside atol" in res["reason"], res

    def ignores_out(inputs, p, out=None):
        return m.launch(inputs, p)

    res = run("quick_careless", ignores_out)
    assert not res["ok"] and "other than the out it was given" in res["reason"], res


# --------------------------------------------------------------------------- #
# (d) from_autotune: configs -> the space, key -> the level dimensions, the chosen config launched
# --------------------------------------------------------------------------- #
def _probe_autotuned():
    import triton
    import triton.language as tl

    configs = [triton.Config({"BLOCK": 16}, num_warps=4, num_stages=2), triton.Config({"BLOCK": 32}, num_warps=8,
               num_stages=2), triton.Config({"BLOCK": 32}, num_warps=4, num_stages=3)]  # fmt: skip

    @triton.autotune(configs=configs, key=["n"])
    @triton.jit
    def probe(out, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(out + i, tl.full([BLOCK], BLOCK, tl.float32), mask=i < n)

    return probe


@interpreted
def test_from_autotune_maps_the_configs_to_the_space_and_the_key_to_the_levels(example):
    import torch

    from kinv.kernels import quick
    from kinv.kernels.errors import ConfigError

    probe = _probe_autotuned()

    def launch(inputs, p, out=None):
        out = torch.zeros(64) if out is None else out
        probe[(1,)](out, inputs["n"])
        return out

    cls = quick.from_autotune("probe", probe, levels=[{"n": 8}, {"n": 24}], make_inputs=lambda lv, s, d, t: {"n": lv.n},
                              launch=launch, reference=lambda inputs: torch.zeros(64), module=f"{PKG}.adapter")  # fmt: skip
    a = cls()
    assert {t.name: t.values for t in a.spec.tunables} == {"BLOCK": (16, 32), "num_warps": (4, 8), "num_stages": (2, 3)}
    assert a.level_dims == ("n",) and [lv.key for lv in a.levels(a.workload_model().model_validate({}))] == ["n8", "n24"]
    ok = [{"BLOCK": 16, "num_warps": 4, "num_stages": 2}, {"BLOCK": 32, "num_warps": 8, "num_stages": 2},
          {"BLOCK": 32, "num_warps": 4, "num_stages": 3}]  # fmt: skip
    for cfg in ok:
        a.validate_config({"kernel": "probe", **cfg})
    with pytest.raises(ConfigError, match="one of the 3 configs of probe's @triton.autotune"):
        a.validate_config({"kernel": "probe", "BLOCK": 16, "num_warps": 8, "num_stages": 2})
    assert a._q.default == ok[0]  # the first config is the default
    lv = a.level({"n": 24})
    out, _ = a.launch({"n": 24}, a.params_for(a.validate_config({"kernel": "probe", **ok[2]}), lv))
    assert out[:24].tolist() == [32.0] * 24 and out[24:].tolist() == [0.0] * 40  # the chosen config's BLOCK ran
    assert probe.cache == {} and not hasattr(probe, "configs_timings")  # the autotuner searched nothing
    with pytest.raises(BadInput, match=r"levels\[0\] must name probe's autotune key \(n\)"):
        quick.from_autotune("probe2", probe, levels=[{"m": 8}], make_inputs=lambda *a: {}, launch=launch,
                            reference=lambda i: None, module=f"{PKG}.adapter")  # fmt: skip


@interpreted
def test_the_examples_autotune_adapter_is_the_autotuners_space_and_passes_the_gate(example):
    from kinv.agent.tools.worker.gate import check

    kernel = importlib.import_module(f"{PKG}.kernel")
    a = _adapter(AUTOTUNE_REF)
    assert a.level_dims == tuple(kernel.matmul_autotuned.keys) == ("M", "N", "K")
    combos = {(c.kwargs["TILE_M"], c.kwargs["TILE_N"], c.kwargs["TILE_K"], c.num_warps, c.num_stages)
              for c in kernel.CONFIGS}  # fmt: skip
    names = [t.name for t in a.spec.tunables]
    assert names == ["TILE_M", "TILE_N", "TILE_K", "num_warps", "num_stages"]
    admitted = {v for v in itertools.product(*(t.values for t in a.spec.tunables))
                if a.spec.restrictions[0].check(dict(zip(names, v)))}  # fmt: skip
    assert admitted == combos
    cfg = {"kernel": a.name, "TILE_M": 128, "TILE_N": 64, "TILE_K": 64, "num_warps": 8, "num_stages": 2}
    res = check(a, cfg, a.levels(a.workload_model().model_validate({})), seed=2, device="cpu")
    assert res["ok"], res


# --------------------------------------------------------------------------- #
# a plugin's own recordings, served by replay with its own banner
# --------------------------------------------------------------------------- #
def _synthetic(path: Path, hashes: dict, base: dict, variants: dict[str, tuple[dict, float]], level_us: dict[str, float],
               aa_rounds: int, aa_arms: int, ab_rounds: int, kernel: str = "quick_matmul") -> None:  # fmt: skip
    """A synthetic replay recording in the v2 layout (benchmarks/record.py), labelled as such: ``variants`` maps a
    name to (config, speed factor against the baseline)."""
    from kinv.kernels.launch_config import config_hash

    rng = random.Random(7)
    header = {"type": "header", "version": 2, "kernel": kernel, "synthetic": True, "copy_gbps": 3456.0,
              "fingerprint": {"gpu": "a synthetic test fixture (not a measurement)", "sms": 0, "torch": "-",
                              "triton": "-"},
              "harness_hash": hashes["harness"], "kernel_hash": hashes["kernel"], "reference_hash": hashes["reference"],
              "env": {}, "configs": {"baseline": base, **{n: c for n, (c, _) in variants.items()}}}  # fmt: skip
    hb = config_hash(base)
    rows = [header]

    def row(kind, pair, role, r, key, chash, us):
        rows.append({"type": "sample", "kind": kind, "pair": pair, "role": role, "round": r, "level": key,
                     "config_hash": chash, "us": us * (1 + rng.gauss(0, 0.002)), "replays": 20, "gpu_s": 0.0002,
                     "t": r})  # fmt: skip

    for key, us in level_us.items():
        for r in range(aa_rounds):
            for j in range(aa_arms):
                row("aa", "aa", f"A{j}", r, key, hb, us)
        for cfg, factor in variants.values():
            hv = config_hash(cfg)
            for r in range(ab_rounds):
                row("ab", hv, "base", r, key, hb, us)
                row("ab", hv, "variant", r, key, hv, us * factor)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for line in rows:
            f.write(json.dumps(line) + "\n")


def test_replay_serves_a_plugins_own_recordings_with_their_own_banner_and_copy_bandwidth(example, monkeypatch):
    from kinv.agent.errors import NoRecording
    from kinv.agent.tools.backends.replay import ReplayBackend
    from kinv.agent.tools.worker.hashes import harness_hash, kernel_hash
    from kinv.agent.tools.worker.hashes import kernel_reference_hash as reference_hash

    monkeypatch.delenv("KINV_RECORDINGS", raising=False)
    a = _adapter()
    hashes = {"harness": harness_hash(), "kernel": kernel_hash(REF), "reference": reference_hash(REF)}
    base = a.validate_config(_config())
    _synthetic(example / PKG / "recordings" / "synthetic" / "quick_matmul.jsonl.gz", hashes, base,
               {"V1": (a.validate_config(_config(TILE_N=128)), 0.9)}, {"M512/N512/K512": 2.0}, 2, 2, 2)  # fmt: skip
    be = ReplayBackend()  # kinv's own recordings: none of this kernel
    assert "synthetic" not in be.loud
    rec = be.for_kernel(REF)
    assert rec.headers[0]["synthetic"] and rec.files[0].parent == example / PKG / "recordings" / "synthetic"
    assert "synthetic test fixture" in be.loud and "the kernel's own recordings" in be.loud, be.loud
    assert be.copy_bandwidth() == 3456.0
    arm = be.open("baseline", REF, base, {}, partner=a.validate_config(_config(TILE_N=128)), role="base")
    assert arm.sample(a.level({"M": 512, "N": 512, "K": 512}), 1)["us"] == pytest.approx(2.0, rel=0.02)
    be.for_kernel("mla_decode")  # kinv's own kernel: its own recordings' banner again
    assert "synthetic" not in be.loud and "own recordings" not in be.loud
    with pytest.raises(NoRecording, match="nor are there any in the kernel's own"):
        be.for_kernel(AUTOTUNE_REF)


# --------------------------------------------------------------------------- #
# (e) installed elsewhere, found by its entry points, run end to end on replay
# --------------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The example built and installed with ``pip install --target`` into a temporary folder (the venv is never
    touched): PYTHONPATH makes its package and its entry points visible to every kinv process."""
    root = tmp_path_factory.mktemp("quick-installed")
    src = _copy_example(root / "src")  # the build's own files (build/, *.egg-info) stay out of the repo
    target = root / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
           "--target", str(target), str(src)]  # fmt: skip
    r = subprocess.run(pip, capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / PKG / "configs" / "quick_matmul.json").is_file()
    yield root, target


def _env(root: Path, target: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KINV_")}
    env.update(TRITON_INTERPRET="1", KINV_FORCE_NO_GPU="1", KINV_STATE_DIR=str(root / "state"),
               PYTHONPATH=os.pathsep.join([str(target), str(ROOT)]))  # fmt: skip
    return env


def _kinv(env, *args, cwd):
    return run_kinv(env, *args, cwd=cwd, timeout=600)


def test_the_installed_example_is_listed_by_its_entry_points(installed):
    root, target = installed
    r = _kinv(_env(root, target), "kernels", "--json", cwd=root)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {k["name"]: k for k in json.loads(r.stdout)}
    assert rows["quick_matmul"]["ref"] == REF and rows["quick_matmul_autotune"]["ref"] == AUTOTUNE_REF
    assert list(rows["quick_matmul"]["tunables"]) == ["TILE_M", "TILE_N", "TILE_K", "num_warps", "num_stages"]
    assert rows["quick_matmul"]["level_dims"] == ["M", "N", "K"] and rows["quick_matmul"]["throughput_unit"] == "TFLOP/s"
    assert rows["quick_matmul"]["config"] == str(target / PKG / "configs" / "quick_matmul.json")
    assert rows["quick_matmul_autotune"]["restrictions"] == ["one of the 4 configs of matmul_kernel's @triton.autotune"]


HASHES = textwrap.dedent("""
    import json, sys
    from kinv.agent.plan_file import load_plan
    from kinv.agent.tools.runners import bench
    from kinv.agent.tools.worker.hashes import harness_hash, kernel_hash
    from kinv.agent.tools.worker.hashes import kernel_reference_hash as reference_hash
    plan, _ = load_plan(sys.argv[1])
    print(json.dumps({"harness": harness_hash(), "kernel": kernel_hash(plan.kernel),
                      "reference": reference_hash(plan.kernel), "base": {**plan.baseline, "kernel": plan.adapter.name},
                      "variants": {v.id: plan.variant_config(v) for v in plan.variants},
                      "levels": {lv.key: 2 * lv.M * lv.N * lv.K for lv in plan.levels()}}))
""")


@pytest.mark.slow  # whole runs (about 10 s each here), as tests/kernels/test_plugin.py marks its own
@pytest.mark.parametrize("plan, ws, kernel, speed, label", [
    ("plan.yaml", "20a", "quick_matmul", {"V1": 0.9, "V2": 1.0, "V3": 1.1}, "TM64/TN128/TK32/w4/s2"),
    ("plan-autotune.yaml", "20b", "quick_matmul_autotune", {"V1": 0.9, "V2": 1.1}, "TM64/TN128/TK32/w4/s3"),
])  # fmt: skip
def test_the_example_plans_run_end_to_end_on_replay_from_the_plugins_own_recordings(installed, plan, ws, kernel, speed,
                                                                                     label):  # fmt: skip
    root, target = installed
    env = _env(root, target)
    work = root / "work"
    work.mkdir(exist_ok=True)
    shutil.copy(EXAMPLE / plan, work / plan)
    r = subprocess.run([sys.executable, "-c", HASHES, plan], env=env, cwd=work, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    info = json.loads(r.stdout)
    us = {key: flops / 300e12 * 1e6 for key, flops in info["levels"].items()}  # 300 TFLOP/s: under the H200's peak
    _synthetic(target / PKG / "recordings" / "synthetic" / f"{kernel}.jsonl.gz", info, info["base"],
               {k: (cfg, speed[k]) for k, cfg in info["variants"].items()}, us, aa_rounds=16, aa_arms=4, ab_rounds=24,
               kernel=kernel)  # fmt: skip
    cfg = target / PKG / "configs" / f"{kernel}.json"
    before = cfg.read_bytes()
    r = _kinv(env, "run", plan, "--backend", "replay", "--approval", "auto", cwd=work)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "synthetic test fixture" in r.stdout and "the kernel's own recordings" in r.stdout, r.stdout
    assert "bytes per call derived by kinv" in r.stdout  # the bytes the roofline uses, said to be derived (the run's
    # baseline step says it; the close-out's roofline section is written by kinv's report, which shows no adapter note)
    assert cfg.read_bytes() == before  # the plugin's own live config, patched and restored
    exps = {e["variant"]: e for e in json.loads(_kinv(env, "experiments", ws, "--json", cwd=work).stdout)}
    want = {v: "accept" if f < 1 else "reject" for v, f in speed.items()}
    assert {v: exps[v]["verdict"] for v in speed} == want, exps
    report = (root / "state" / "reports" / f"{ws}-closeout.md").read_text()
    assert "| M512/N512/K512 |" in report and "| M128/N4096/K4096 |" in report  # its level names in every table
    assert "TFLOP/s" in report and label in report  # its unit and its tunable labels
    assert "synthetic recordings" in report and "## Roofline" in report
