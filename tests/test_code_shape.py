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


# Re-exports left: a kernel file whose bytes are
# hashed into its recordings' identity (editing it would orphan the recorded samples).
KNOWN_REEXPORTS = [
    "kernels/moe_expert_gemm.py re-exports 1 names: moe_expert_gemm_reference",
]


def test_no_import_climbs_a_floor(shape):
    """The measurement core (agent/tools/measure/) imports nothing of its runners (agent/tools/runners/), and no
    backend or worker imports the core: a module only imports its own room and the rooms below it."""
    assert shape.shape(str(ROOT))["climbs"] == []


def test_every_name_is_imported_from_where_it_is_defined(shape):
    assert shape.shape(str(ROOT))["facades"] == KNOWN_REEXPORTS


def test_the_store_and_campaign_packages_re_export_nothing():
    """Their ``__init__`` is a docstring: a caller imports Store from store/db.py, campaign_id from driver.py."""
    import ast

    for pkg in ("agent/store/__init__.py", "agent/campaign/__init__.py"):
        body = ast.parse((ROOT / pkg).read_text()).body
        assert [type(n).__name__ for n in body] == ["Expr"], pkg


def test_every_product_module_sits_on_a_floor(shape):
    """A new module must be given a floor in FLOORS, or its climbs would go unseen."""
    modules, _ = shape.load(str(ROOT))
    unplaced = [p for p in modules if p.split("/")[0] in shape.PACKAGES and not p.endswith("__init__.py")
                and shape.floor_of(p) is None and not p.startswith("kernels/")]
    assert unplaced == []


def test_the_measures_see_what_they_look_for(shape, tmp_path):
    """A circle, a climb and a facade planted in a small tree are each found (a lazy import counts; an
    ``__init__`` with ``__all__`` is a facade all the same; a runner may import the measurement core, but neither
    the core its runners nor a backend the core)."""
    m = tmp_path / "agent" / "tools" / "measure"
    r = tmp_path / "agent" / "tools" / "runners"
    b = tmp_path / "agent" / "tools" / "backends"
    s = tmp_path / "agent" / "store"
    for d in (m, r, b, s):
        d.mkdir(parents=True)
    for d in (tmp_path / "agent", tmp_path / "agent" / "tools", m, r, b):
        (d / "__init__.py").write_text("")
    (m / "stats.py").write_text("def f():\n    from kinv.agent.tools.measure import noise\n\nX = 1\n")
    (m / "noise.py").write_text("from kinv.agent.tools.measure.stats import X\n")
    (m / "protocol.py").write_text("from kinv.agent.tools.measure.noise import X\n\nY = X\n")
    (r / "bench.py").write_text("from kinv.agent.tools.measure import protocol\n\nV = 1\n")
    (m / "sequential.py").write_text("def f():\n    from kinv.agent.tools.runners.bench import V\n    return V\n")
    (b / "base.py").write_text("def f():\n    from kinv.agent.tools.measure.stats import X\n    return X\n")
    (s / "db.py").write_text("class Store:\n    pass\n")
    (s / "__init__.py").write_text('from kinv.agent.store.db import Store\n\n__all__ = ["Store"]\n')
    (m / "envcheck.py").write_text("from kinv.agent.store import Store\n\nS = Store()\n")
    got = shape.shape(str(tmp_path))
    assert got["circles"] == [["kinv.agent.tools.measure.noise", "kinv.agent.tools.measure.stats"]]
    assert got["climbs"] == ["agent/tools/backends/base.py (backends) -> agent/tools/measure/stats.py (measure)",
                             "agent/tools/measure/sequential.py (measure) -> agent/tools/runners/bench.py (runners)"]
    assert got["facades"] == [
        "agent/store/__init__.py re-exports 1 names: Store",
        "agent/tools/measure/envcheck.py:1 imports Store from agent/store/__init__.py (defined in kinv.agent.store.db)",
        "agent/tools/measure/noise.py re-exports 1 names: X",
        "agent/tools/measure/protocol.py:1 imports X from agent/tools/measure/noise.py (defined in kinv.agent.tools.measure.stats)",
    ]
