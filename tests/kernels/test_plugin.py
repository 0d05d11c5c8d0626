"""A kernel from an outside package, as a new user would bring one: no change to kinv, no monkeypatch.

The test writes a small package in a temporary directory -- its own pyproject with a ``kinv.kernels``
entry point, a Triton tiled matmul whose tunables have names kinv has never seen (TILE_M, TILE_N,
TILE_K, num_warps), 2-D levels (M x N at a fixed K), its own config file and plan -- installs it with
``pip install -e``, and checks that ``kinv kernels`` lists it and that ``kinv run`` investigates it end to
end on CPU: correctness in the Triton interpreter, timings replayed from a recording the test writes.

That recording is a synthetic fixture (its header says so, and so does the replay banner): the point is
the plumbing -- tunable names in every table, level names in every key, the plugin's config patched and
restored -- not the numbers.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = "kinv_demo_matmul"

PYPROJECT = f"""
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "kinv-demo-matmul"
version = "0.1.0"

[project.entry-points."kinv.kernels"]
tiled_matmul = "{PKG}.adapter:TiledMatmulAdapter"

[tool.setuptools]
packages = ["{PKG}"]

[tool.setuptools.package-data]
{PKG} = ["configs/*.json"]
"""

KERNEL = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _matmul(A, B, C, M, N, K, sam, sak, sbk, sbn, scm, scn,
            TILE_M: tl.constexpr, TILE_N: tl.constexpr, TILE_K: tl.constexpr):
    pm, pn = tl.program_id(0), tl.program_id(1)
    rm = pm * TILE_M + tl.arange(0, TILE_M)
    rn = pn * TILE_N + tl.arange(0, TILE_N)
    acc = tl.zeros([TILE_M, TILE_N], dtype=tl.float32)
    for k0 in range(0, K, TILE_K):
        rk = k0 + tl.arange(0, TILE_K)
        a = tl.load(A + rm[:, None] * sam + rk[None, :] * sak, mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(B + rk[:, None] * sbk + rn[None, :] * sbn, mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(C + rm[:, None] * scm + rn[None, :] * scn, acc.to(C.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a, b, p, out=None):
    m, k = a.shape
    n = b.shape[1]
    out = torch.empty((m, n), dtype=a.dtype, device=a.device) if out is None else out
    grid = (triton.cdiv(m, p.TILE_M), triton.cdiv(n, p.TILE_N))
    c = _matmul[grid](a, b, out, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                      out.stride(0), out.stride(1), TILE_M=p.TILE_M, TILE_N=p.TILE_N, TILE_K=p.TILE_K,
                      num_warps=p.num_warps)
    return out, c
'''

ADAPTER = '''
from kinv.kernels.adapter import KernelAdapter, Resources
from kinv.kernels.tunables import Restriction, Tunable, TunableSpec

SPEC = TunableSpec(
    kernel="tiled_matmul",
    tunables=(Tunable("TILE_M", (16, 32), "m"), Tunable("TILE_N", (16, 32), "n"),
              Tunable("TILE_K", (16, 32), "k"), Tunable("num_warps", (1, 2, 4), "w")),
    restrictions=(Restriction("TILE_M x TILE_N <= 512 x num_warps", lambda v: v["TILE_M"] * v["TILE_N"] <= 512 * v["num_warps"]),),
)


def _workload():
    from pydantic import BaseModel, ConfigDict, Field

    class MatmulWorkload(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        shapes: list[list[int]] = Field(description="[M, N] pairs")
        k: int = Field(32, ge=1, le=4096)

    return MatmulWorkload


class TiledMatmulAdapter(KernelAdapter):
    name = "tiled_matmul"
    spec = SPEC
    level_dims = ("M", "N", "K")
    throughput_unit = "GFLOP/s"
    kernel_files = ("kinv_demo_matmul/kernel.py",)
    reference_parts = (("kinv_demo_matmul/adapter.py", "TiledMatmulAdapter.reference"),)

    def level_key(self, dims):
        return f"M{dims['M']}xN{dims['N']}/K{dims['K']}"

    def level_label(self, dims):
        return f"M{dims['M']}xN{dims['N']}"

    def workload_model(self):
        return _workload()

    def levels(self, workload):
        return [self.level({"M": m, "N": n, "K": workload.k}) for m, n in workload.shapes]

    def make_inputs(self, level, seed, device="cuda", dtype=None, vary_lengths=False):
        import torch

        g = torch.Generator(device=device).manual_seed(seed)
        dtype = dtype or torch.float16
        return {"a": torch.randn((level.M, level.K), generator=g, device=device).to(dtype),
                "b": torch.randn((level.K, level.N), generator=g, device=device).to(dtype)}

    def launch(self, inputs, params, out=None, scratch=None, **mode):
        from kinv_demo_matmul.kernel import matmul

        return matmul(inputs["a"], inputs["b"], params, out=out)

    def reference(self, inputs):
        return inputs["a"].float() @ inputs["b"].float()

    def tolerance(self, dtype):
        return (2e-2, 2e-2)

    def bytes_moved(self, level):
        return 2 * (level.M * level.K + level.K * level.N + level.M * level.N)

    def flops(self, level):
        return 2 * level.M * level.N * level.K

    def throughput(self, level, us):
        return self.flops(level) / (us * 1e-6) / 1e9

    def resources(self, params, level, device, compiled=None):
        smem = 2 * (params.TILE_M + params.TILE_N) * params.TILE_K
        return Resources(smem_estimate=smem, feasible=smem <= device.smem_per_block,
                         why={"programs": -(-level.M // params.TILE_M) * -(-level.N // params.TILE_N)})
'''

PLAN = """
workstream: {id: "#9a", title: "Tile shape of a user's matmul", parent: "#9"}
kernel: tiled_matmul
hypothesis: A wider N tile reuses each loaded A tile twice as often.
device: sm_90
workload: {shapes: [[32, 32], [32, 64]], k: 32}
baseline: {TILE_M: 16, TILE_N: 16, TILE_K: 16, num_warps: 1}
variants:
  - {id: V1, title: "TILE_N 32", patch: {TILE_N: 32}, targets: tile_shape}
bounds: {TILE_N: [16, 32]}
stats: {threshold: 0.01, aa_rounds: 8, aa_arms: 2, quick_rounds: 4, step_rounds: 4, max_rounds: 8}
"""


def _write_package(root: Path, pkg: str = PKG) -> Path:
    """The demo plugin's source tree under ``root/plugin``; ``pkg`` renames its package (a test that needs it
    uninstalled must not share a name with the one this module's fixture installs)."""
    src = root / "plugin"
    (src / pkg / "configs").mkdir(parents=True)
    (src / "pyproject.toml").write_text(PYPROJECT.replace(PKG, pkg).replace(PKG.replace("_", "-"), pkg.replace("_", "-")))
    (src / pkg / "__init__.py").write_text("")
    (src / pkg / "kernel.py").write_text(textwrap.dedent(KERNEL).replace(PKG, pkg))
    (src / pkg / "adapter.py").write_text(textwrap.dedent(ADAPTER).replace(PKG, pkg))
    cfg = {"kernel": "tiled_matmul", "TILE_M": 16, "TILE_N": 16, "TILE_K": 16, "num_warps": 1}
    (src / pkg / "configs" / "tiled_matmul.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (src / "plan.yaml").write_text(PLAN.replace(PKG, pkg))
    return src


def _recording(path: Path, env: dict, kernel: str = "tiled_matmul", cwd: Path = ROOT) -> None:
    """A synthetic replay recording in the v2 layout (benchmarks/record.py), labelled as such; ``kernel`` as the
    plan names it (a registered name, or package.module:Class importable from ``cwd``)."""
    code = textwrap.dedent("""
        import json, sys
        from kinv.agent.tools.worker import hashes
        from kinv.agent.tools.worker.hashes import kernel_hash
        from kinv.agent.tools.worker.hashes import kernel_reference_hash as reference_hash
        from kinv.kernels.adapter import get_adapter
        from kinv.kernels.launch_config import config_hash
        kernel = sys.argv[1]
        a = get_adapter(kernel)
        base = a.validate_config({"kernel": "tiled_matmul", "TILE_M": 16, "TILE_N": 16, "TILE_K": 16, "num_warps": 1})
        var = a.validate_config({**base, "TILE_N": 32})
        print(json.dumps({"kernel_hash": kernel_hash(kernel), "reference_hash": reference_hash(kernel),
                          "harness_hash": hashes.harness_hash(), "base": base, "var": var,
                          "hb": config_hash(base), "hv": config_hash(var)}))
    """)
    info = json.loads(subprocess.run([sys.executable, "-c", code, kernel], env=env, capture_output=True, text=True,
                                     check=True, cwd=cwd).stdout)  # fmt: skip
    levels = [{"M": 32, "N": 32, "K": 32}, {"M": 32, "N": 64, "K": 32}]
    keys = [f"M{lv['M']}xN{lv['N']}/K{lv['K']}" for lv in levels]
    header = {"type": "header", "version": 2, "kernel": "tiled_matmul", "synthetic": True,
              "fingerprint": {"gpu": "a synthetic test fixture (not a measurement)", "sms": 0, "torch": "-",
                              "triton": "-"},
              "harness_hash": info["harness_hash"], "kernel_hash": info["kernel_hash"],
              "reference_hash": info["reference_hash"], "env": {}, "configs": {"baseline": info["base"],
                                                                                 "V1": info["var"]}}  # fmt: skip
    rows = [header]
    for r in range(8):
        wobble = 1 + 0.001 * ((r * 7) % 5 - 2)
        for key in keys:
            for j in range(2):
                rows.append({"type": "sample", "kind": "aa", "pair": "aa", "role": f"A{j}", "round": r, "level": key,
                             "config_hash": info["hb"], "us": 10.0 * wobble * (1 + 0.0005 * j), "replays": 20,
                             "gpu_s": 0.0002, "t": r})  # fmt: skip
            rows.append({"type": "sample", "kind": "ab", "pair": info["hv"], "role": "base", "round": r, "level": key,
                         "config_hash": info["hb"], "us": 10.0 * wobble, "replays": 20, "gpu_s": 0.0002, "t": r})
            rows.append({"type": "sample", "kind": "ab", "pair": info["hv"], "role": "variant", "round": r,
                         "level": key, "config_hash": info["hv"], "us": 8.0 * wobble, "replays": 20, "gpu_s": 0.0002,
                         "t": r})  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    root = tmp_path_factory.mktemp("outside")
    src = _write_package(root)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-e", str(src)]
    r = subprocess.run(pip, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        yield root, src
    finally:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", "kinv-demo-matmul"], capture_output=True)


def _env(root: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KINV_")}
    env.update(TRITON_INTERPRET="1", KINV_FORCE_NO_GPU="1", KINV_STATE_DIR=str(root / "state"),
               KINV_RECORDINGS=str(root / "recordings"))  # fmt: skip
    env.pop("PYTHONPATH", None)  # the installed kinv (pip install -e .), as a user has it
    return env


def _kinv(env, *args, cwd):
    return subprocess.run([sys.executable, "-m", "kinv.agent.cli.app", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def test_an_installed_plugin_is_listed_with_its_own_tunables_and_level_dimensions(plugin):
    root, src = plugin
    r = _kinv(_env(root), "kernels", "--json", cwd=src)
    assert r.returncode == 0, r.stdout + r.stderr
    mine = next(k for k in json.loads(r.stdout) if k["name"] == "tiled_matmul")
    assert mine["ref"] == f"{PKG}.adapter:TiledMatmulAdapter"
    assert list(mine["tunables"]) == ["TILE_M", "TILE_N", "TILE_K", "num_warps"]
    assert mine["level_dims"] == ["M", "N", "K"] and mine["throughput_unit"] == "GFLOP/s"
    assert {"mla_decode", "moe_expert_gemm"} <= {k["name"] for k in json.loads(r.stdout)}


@pytest.mark.slow  # a whole run
def test_a_plugin_plan_runs_end_to_end_in_its_own_terms_and_restores_its_config(plugin):
    root, src = plugin
    env = _env(root)
    _recording(root / "recordings" / "tiled_matmul.jsonl.gz", env)
    cfg = src / PKG / "configs" / "tiled_matmul.json"
    before = cfg.read_bytes()
    r = _kinv(env, "run", "plan.yaml", "--backend", "replay", "--approval", "auto", cwd=src)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "synthetic test fixture" in r.stdout  # the replay banner says what it serves
    assert cfg.read_bytes() == before  # the plugin's own live config, patched and restored
    exps = {e["variant"]: e for e in json.loads(_kinv(env, "experiments", "9a", "--json", cwd=src).stdout)}
    assert exps["V1"]["verdict"] == "accept"
    report = (root / "state" / "reports" / "9a-closeout.md").read_text()
    assert "| M32xN32 |" in report and "| M32xN64 |" in report  # its level names in every table
    assert "GFLOP/s" in report and "m16/n32/k16/w1" in report  # its unit and its tunable label
    assert "BLOCK_T" not in report and "tok/s" not in report and "batch" not in report.lower()
    verdicts = json.loads(_kinv(env, "show", str(exps["V1"]["id"]), "--json", cwd=src).stdout)["effects"]
    assert {v["level"] for v in verdicts} == {"M32xN32/K32", "M32xN64/K32"}


def _plan_naming_the_class(src) -> str:
    plan = (src / "plan.yaml").read_text().replace("kernel: tiled_matmul", f"kernel: {PKG}.adapter:TiledMatmulAdapter")
    return plan.replace('id: "#9a"', 'id: "#9b"')


@pytest.mark.slow  # a whole run
def test_a_plan_may_name_the_adapter_class_directly(plugin):
    root, src = plugin
    env = _env(root)
    (src / "plan-ref.yaml").write_text(_plan_naming_the_class(src))
    _recording(root / "recordings" / "tiled_matmul.jsonl.gz", env)
    r = _kinv(env, "run", "plan-ref.yaml", "--backend", "replay", "--approval", "auto", cwd=src)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_plan_naming_a_class_its_package_lacks_is_one_line_exit_2(plugin):
    root, src = plugin
    env = _env(root)
    plan = _plan_naming_the_class(src)
    bad = plan.replace(f"{PKG}.adapter:TiledMatmulAdapter", f"{PKG}.adapter:NoSuchAdapter").replace("#9b", "#9c")
    (src / "plan-bad.yaml").write_text(bad)
    r = _kinv(env, "run", "plan-bad.yaml", "--backend", "replay", "--approval", "auto", cwd=src)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "NoSuchAdapter" in (r.stdout + r.stderr) and len((r.stdout + r.stderr).strip().splitlines()) == 1


@pytest.mark.slow  # a whole run
def test_a_plugins_config_keeps_its_own_key_order_and_description_through_a_patch(plugin, tmp_path):
    root, src = plugin
    env = {**_env(root), "KINV_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(ROOT)}  # this checkout's kinv
    _recording(root / "recordings" / "tiled_matmul.jsonl.gz", env)
    cfg = src / PKG / "configs" / "tiled_matmul.json"
    shipped = cfg.read_bytes()
    own = {"num_warps": 1, "TILE_K": 16, "TILE_N": 16, "TILE_M": 16, "kernel": "tiled_matmul",
           "description": "the plugin's own words, last"}  # fmt: skip
    cfg.write_text(json.dumps(own, indent=4) + "\n")
    before = cfg.read_bytes()
    (src / "plan-order.yaml").write_text((src / "plan.yaml").read_text().replace('id: "#9a"', 'id: "#9d"'))
    try:
        r = _kinv(env, "run", "plan-order.yaml", "--backend", "replay", "--approval", "auto", cwd=src)
        assert r.returncode == 0, r.stdout + r.stderr
        assert cfg.read_bytes() == before  # restored byte for byte
        from kinv.agent.store.db import Store

        diff = next(p for p in Store(tmp_path / "state").patches("#9d") if p["kind"] == "config")["diff"]
        changed = [ln for ln in diff.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
        assert changed == ['-    "TILE_N": 16,', '+    "TILE_N": 32,'], diff  # one line, in the plugin's order
    finally:
        cfg.write_bytes(shipped)
