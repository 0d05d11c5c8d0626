"""The static screen of source patches (agent/tools/measure/reach.py): every construct that reaches for the harness is
named with its line, kinv's own kernels and the examples' are not flagged, a construct the baseline already holds is
not the patch's, and a plan's ``allow_harness_reach`` lets the named constructs through and no others."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
import yaml

from kinv.agent.errors import PlanError
from kinv.agent.plan_file import load_plan
from kinv.agent.plan_sections import Variant
from kinv.agent.tools.measure.reach import refusal, screen_patch, screen_source, screen_variant
from kinv.agent.words import HarnessReach
from kinv.kernels.adapter import get_adapter

ROOT = Path(__file__).resolve().parents[4]

# (construct, source): the line marked `# <-` is the one the screen must name
CASES = [
    ("gc", "import torch\nimport gc  # <-\n"),
    ("gc", "from gc import get_objects  # <-\n"),
    ("gc", "def f():\n    return object.__subclasses__()  # <-\n"),
    ("ctypes", "import ctypes  # <-\n"),
    ("ctypes", "from cffi import FFI  # <-\n"),
    ("frames", "import inspect  # <-\n"),
    ("frames", "import sys\n\ndef f():\n    return sys._getframe(1)  # <-\n"),
    ("frames", "from sys import _getframe  # <-\n"),
    ("frames", "def f(frame):\n    return frame.f_back  # <-\n"),
    ("frames", "def f(exc):\n    return exc.__traceback__.tb_frame  # <-\n"),
    ("frames", "def f(frame):\n    return getattr(frame, 'f_locals')  # <-\n"),
    ("function_internals", "def f(a, b):\n    a.__code__ = b  # <-\n"),
    ("function_internals", "def f(g):\n    return g.__globals__  # <-\n"),
    ("tracing", "import sys\nsys.settrace(None)  # <-\n"),
    ("tracing", "import threading\nthreading.setprofile(None)  # <-\n"),
    ("threads", "import threading\nfor t in threading.enumerate():  # <-\n    pass\n"),
    ("threads", "import sys\nframes = sys._current_frames()  # <-\n"),
    ("threads", "import _thread  # <-\n"),
    ("threads", "from threading import Thread\n\nThread(target=print).start()  # <-\n"),
    ("signals", "import signal\nsignal.signal(signal.SIGALRM, print)  # <-\n"),
    ("signals", "import signal as s\ns.setitimer(s.ITIMER_REAL, 0.001)  # <-\n"),
    ("signals", "import faulthandler  # <-\n"),
    ("kill", "import os\nos.kill(1, 19)  # <-\n"),
    ("kill", "from os import killpg  # <-\n"),
    ("processes", "import subprocess  # <-\n"),
    ("processes", "import os\npid = os.fork()  # <-\n"),
    ("processes", "import os\nos.execv('/bin/true', [])  # <-\n"),
    ("module_write", "import torch\ntorch.cuda.Event.elapsed_time = lambda s, e: 0.0  # <-\n"),
    ("module_write", "import torch\nsetattr(torch.cuda, 'synchronize', print)  # <-\n"),
    ("module_write", "from . import mla_decode_ref\n\ndef f(g):\n    mla_decode_ref.mla_decode_reference = g  # <-\n"),
    ("module_write", "import os\nos.environ['X'] = '1'  # <-\n"),
    ("module_write", "import torch\ndel torch.cuda.synchronize  # <-\n"),
    ("module_write", "import torch\nvars(torch)['x'] = 1  # <-\n"),
    ("module_write", "import torch\ntorch.cuda.Event.__dict__.update(x=1)  # <-\n"),
    ("module_write", "import os\nos.environ.update(X='1')  # <-\n"),
    ("module_write", "from .tunables import LIMITS\nLIMITS['BLOCK_T'] = 1  # <-\n"),
    ("sys_modules", "import sys\nsys.modules['torch'] = None  # <-\n"),
    ("builtins", "import builtins  # <-\n"),
    ("builtins", "__builtins__['print'] = None  # <-\n"),
    ("reload", "import importlib\nimport torch\nimportlib.reload(torch)  # <-\n"),
    ("dynamic_code", "exec('x = 1')  # <-\n"),
    ("dynamic_code", "m = __import__('g' + 'c')  # <-\n"),
    ("dynamic_code", "import importlib\nm = importlib.import_module('g' + 'c')  # <-\n"),
    ("dynamic_code", "import sys\nname = '_get' + 'frame'\nf = getattr(sys, name)  # <-\n"),
    ("harness_import", "from kinv.agent.tools.worker import bench_worker  # <-\n"),
    ("harness_import", "import kinv.agent.store  # <-\n"),
    ("harness_import", "from ..agent.tools.worker import bench_worker  # <-\n"),
    ("proc_files", "mem = open('/proc/self/mem', 'rb')  # <-\n"),
]


@pytest.mark.parametrize("construct, source", CASES, ids=[f"{c}-{i}" for i, (c, _) in enumerate(CASES)])
def test_each_construct_is_named_with_its_line(construct, source):
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "# <-" in text)
    found = screen_source(source, "kernels/k.py", package="kinv.kernels")
    hits = {f.line: f for f in found if f.construct == construct}  # a from-import's uses are named too
    assert line in hits, [f.refused() for f in found]
    said = hits[line].refused()
    assert said.startswith(f"kernels/k.py:{line}: {construct} reaches for the harness (")
    assert said.endswith(f"refused — a plan may allow it with `allow_harness_reach: [{construct}]`")
    assert "\n" not in said


def test_every_construct_has_a_case():
    assert {c for c, _ in CASES} == set(HarnessReach)


@pytest.mark.parametrize("path", ["kernels/mla_decode.py", "kernels/moe_expert_gemm.py", "kernels/mla_decode_ref.py",
                                  "kernels/moe_expert_gemm_ref.py", "examples/quick_matmul/kinv_quick_matmul/kernel.py",
                                  "examples/torch_kernels/kinv_torch_kernels/outer_product.py",
                                  "examples/torch_kernels/kinv_torch_kernels/outer_product_autotune.py",
                                  "examples/cpu_matmul.py"])  # fmt: skip
def test_benign_kernels_are_not_flagged(path):
    assert [f.refused() for f in screen_source((ROOT / path).read_text(), path, package="kinv.kernels")] == []


def test_the_kernels_own_state_is_its_own_to_write():
    source = ("import torch\n_CACHE = {}\n\nclass K:\n    def __init__(self):\n        self.grid = None\n\n"
              "def launch(x):\n    global _CACHE\n    _CACHE[x.shape] = torch.empty(1)\n    k = K()\n    k.grid = (1,)\n"
              "    torch.cuda.synchronize()\n    return triton_compile(x)\n")  # fmt: skip
    assert screen_source(source, "k.py") == []


def test_a_construct_the_baseline_holds_is_not_the_patchs():
    before = "import os\n\nos.environ['A'] = '1'\n\ndef f():\n    return 1\n"
    moved = "import os\n\n\ndef f():\n    return 2\n\nos.environ['A'] = '1'\n"
    assert screen_patch(before, moved, "k.py") == []
    added = moved + "os.environ['B'] = '2'\n"
    assert [(f.line, f.construct) for f in screen_patch(before, added, "k.py")] == [(8, "module_write")]


def test_an_added_import_turns_an_old_line_into_a_write_on_a_module():
    before = "x = object()\n\ndef f():\n    x.y = 1\n"
    after = "import numpy as x\n\ndef f():\n    x.y = 1\n"
    assert [(f.line, f.construct) for f in screen_patch(before, after, "k.py")] == [(4, "module_write")]


def test_a_source_that_does_not_parse_is_the_compile_gates():
    assert screen_source("import gc\ndef f(:\n", "k.py") == []


# --------------------------------------------------------------------------- #
# a variant's source patch, and the plan's opt-in
# --------------------------------------------------------------------------- #
def gc_patch(where: Path) -> tuple[str, int]:
    """plans/patches/gc.diff under ``where``: kernels/mla_decode.py with ``import gc`` and a walk of it added;
    returns the path and the line of the import in the patched file."""
    rel = "kernels/mla_decode.py"
    old = (ROOT / rel).read_text().splitlines(keepends=True)
    at = next(i for i, ln in enumerate(old) if ln.startswith("import "))
    new = old[:at] + ["import gc\n"] + old[at:] + ["\n", "def _walk():\n", "    return len(gc.get_objects())\n"]
    diff = "".join(difflib.unified_diff(old, new, f"a/{rel}", f"b/{rel}"))
    (where / "plans" / "patches").mkdir(parents=True, exist_ok=True)
    (where / "plans" / "patches" / "gc.diff").write_text(diff)
    return "plans/patches/gc.diff", at + 1


def test_a_variant_that_adds_import_gc_is_refused_with_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path, line = gc_patch(tmp_path)
    v = Variant(id="G1", title="walks the garbage collector", source_patch=path)
    said = refusal(get_adapter("mla_decode"), v)
    assert said == (f"kernels/mla_decode.py:{line}: gc reaches for the harness (import gc: the garbage collector hands "
                    "out every live object, the harness's timing state too); refused — a plan may allow it with "
                    "`allow_harness_reach: [gc]`")  # fmt: skip


def test_the_plans_opt_in_lets_the_named_construct_through_and_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path, line = gc_patch(tmp_path)
    v = Variant(id="G1", title="walks the garbage collector", source_patch=path, allow_harness_reach=["gc"])
    allowed: list[str] = []
    assert refusal(get_adapter("mla_decode"), v, allowed=allowed.append) == ""
    assert allowed == [f"kernels/mla_decode.py:{line}: gc reaches for the harness (import gc: the garbage collector "
                       "hands out every live object, the harness's timing state too); allowed by the plan "
                       "(allow_harness_reach: [gc])"]  # fmt: skip
    other = Variant(id="G2", title="x", source_patch=path, allow_harness_reach=["ctypes"])
    assert "gc reaches for the harness" in refusal(get_adapter("mla_decode"), other)


def test_the_baseline_snapshot_is_what_a_gate_screens_against(tmp_path, monkeypatch):
    """At a run's gate the live file is patched: the screen reads the baseline from the snapshot."""
    monkeypatch.chdir(tmp_path)
    path, line = gc_patch(tmp_path)
    adapter = get_adapter("mla_decode")
    snap = tmp_path / "snap"
    dest = snap / "kinv" / "kernels" / "mla_decode.py"
    dest.parent.mkdir(parents=True)
    dest.write_bytes((ROOT / "kernels" / "mla_decode.py").read_bytes())
    s = screen_variant(adapter, Variant(id="G1", title="x", source_patch=path), baseline=snap)
    assert [(f.line, f.construct) for f in s.refused] == [(line, "gc")]


def test_a_variant_without_a_source_patch_is_not_screened():
    assert refusal(get_adapter("mla_decode"), Variant(id="V1", title="x", patch={"BLOCK_T": 32})) == ""


def test_the_shipped_source_patches_of_real_work_are_not_flagged():
    plan, _ = load_plan(ROOT / "plans" / "10a-decode-persistent.yaml")
    for v in plan.variants:
        if v.source_patch:
            assert screen_variant(plan.adapter, v).refused == []


# --------------------------------------------------------------------------- #
# the plan field
# --------------------------------------------------------------------------- #
def _plan_with(tmp_path, **fields) -> Path:
    p = yaml.safe_load((ROOT / "plans" / "6b-source-null.yaml").read_text())
    p["variants"][0].update(fields)
    f = tmp_path / "plan.yaml"
    f.write_text(yaml.safe_dump(p, sort_keys=False))
    return f


def test_an_unknown_construct_is_refused_in_one_line_naming_the_valid_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(PlanError) as exc:
        load_plan(_plan_with(tmp_path, allow_harness_reach=["gc", "gcc"]))
    said = str(exc.value)
    assert "\n" not in said
    assert "variants.0.allow_harness_reach: 'gcc' is not a construct the screen knows; valid: gc, ctypes, " in said


def test_an_opt_in_without_a_source_patch_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    f = _plan_with(tmp_path, allow_harness_reach=["gc"], patch={"BLOCK_T": 32})
    p = yaml.safe_load(f.read_text())
    del p["variants"][0]["source_patch"]
    f.write_text(yaml.safe_dump(p, sort_keys=False))
    with pytest.raises(PlanError, match="allow_harness_reach: names constructs of a source patch"):
        load_plan(f)


def test_the_drills_opt_in_where_they_drill_the_defences_behind_the_screen(monkeypatch):
    """The fault and harness drills plant tricks the screen refuses; each opts in so its own gate is drilled."""
    monkeypatch.chdir(ROOT)
    for name in ("6a-fault-drill", "6c-harness-drill"):
        plan, _ = load_plan(ROOT / "plans" / f"{name}.yaml")
        for v in plan.variants:
            if v.source_patch and v.id != "F7":  # F7's patch does not apply: the patch step stops it
                assert screen_variant(plan.adapter, v).refused == [], (name, v.id)
