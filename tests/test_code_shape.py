"""The house's shape: no import circles, nothing that imports a floor above it, no re-export facades.

benchmarks/code_shape.py reads the source with ast (nothing of kinv or torch is imported), so this is fast."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shape():
    spec = importlib.util.spec_from_file_location("code_shape", ROOT / "benchmarks" / "code_shape.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["code_shape"] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("code_shape", None)


def test_no_import_circles(shape):
    assert shape.shape(str(ROOT))["circles"] == []


def test_no_import_climbs_a_floor(shape):
    assert shape.shape(str(ROOT))["climbs"] == []


def test_every_name_is_imported_from_where_it_is_defined(shape):
    assert shape.shape(str(ROOT))["facades"] == []


def test_every_product_module_sits_on_a_floor(shape):
    """A new module must be given a floor in FLOORS, or its climbs would go unseen."""
    modules, _ = shape.load(str(ROOT))
    unplaced = [p for p in modules if p.split("/")[0] in shape.PACKAGES and not p.endswith("__init__.py")
                and shape.floor_of(p) is None and not p.startswith("kernels/")]
    assert unplaced == []


def test_the_measures_see_what_they_look_for(shape, tmp_path):
    """A circle, a climb and a facade planted in a small tree are each found (a lazy import counts)."""
    (tmp_path / "agent" / "tools").mkdir(parents=True)
    (tmp_path / "agent" / "__init__.py").write_text("")
    (tmp_path / "agent" / "tools" / "__init__.py").write_text("")
    (tmp_path / "agent" / "stats.py").write_text("def f():\n    from kinv.agent import noise\n\nX = 1\n")
    (tmp_path / "agent" / "noise.py").write_text("from kinv.agent.stats import X\n")
    (tmp_path / "agent" / "tools" / "protocol.py").write_text("from kinv.agent.noise import X\n")
    (tmp_path / "agent" / "tools" / "bench.py").write_text("from kinv.agent.tools import protocol\n")
    (tmp_path / "agent" / "tools" / "envcheck.py").write_text("from kinv.agent.tools import bench\n")
    s = shape.shape(str(tmp_path))
    assert s["circles"] == [["kinv.agent.noise", "kinv.agent.stats"]]
    assert "agent/stats.py (checks and figures) -> agent/noise.py (measure)" in s["climbs"]
    assert "agent/tools/envcheck.py (checks and figures) -> agent/tools/bench.py (measure)" in s["climbs"]
    assert s["facades"] == ["agent/tools/protocol.py:1 imports X from agent/noise.py (defined in kinv.agent.stats)"]
