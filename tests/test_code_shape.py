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
    m = tmp_path / "agent" / "tools" / "measure"
    m.mkdir(parents=True)
    for d in (tmp_path / "agent", tmp_path / "agent" / "tools", m):
        (d / "__init__.py").write_text("")
    (m / "stats.py").write_text("def f():\n    from kinv.agent.tools.measure import noise\n\nX = 1\n")
    (m / "noise.py").write_text("from kinv.agent.tools.measure.stats import X\n")
    (m / "protocol.py").write_text("from kinv.agent.tools.measure.noise import X\n")
    (m / "bench.py").write_text("from kinv.agent.tools.measure import protocol\n")
    (m / "envcheck.py").write_text("from kinv.agent.tools.measure import bench\n")
    s = shape.shape(str(tmp_path))
    assert s["circles"] == [["kinv.agent.tools.measure.noise", "kinv.agent.tools.measure.stats"]]
    assert "agent/tools/measure/stats.py (checks and figures) -> agent/tools/measure/noise.py (measure)" in s["climbs"]
    assert "agent/tools/measure/envcheck.py (checks and figures) -> agent/tools/measure/bench.py (measure)" in s["climbs"]
    assert s["facades"] == ["agent/tools/measure/protocol.py:1 imports X from agent/tools/measure/noise.py (defined in kinv.agent.tools.measure.stats)"]
