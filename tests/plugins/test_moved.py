"""Old paths keep working: every name a plugin could import from kinv.kernels.* at 0.2.0 still imports from there
(tests/plugins/names_020.txt lists them), and a name that moved raises a DeprecationWarning naming its new path and
the release that removes the old one; ``kinv check`` reads a plugin's imports and says the same, and names the public
replacement of every private import."""

from __future__ import annotations

import importlib
import re
import textwrap
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

import kinv.plugin
from kinv.kernels import moved

NAMES_020 = [ln for ln in Path(__file__).with_name("names_020.txt").read_text().splitlines()
             if ln and not ln.startswith("#")]  # fmt: skip


@pytest.mark.parametrize("path", NAMES_020)
def test_every_name_of_0_2_0_still_imports_from_its_old_path(path):
    module, _, name = path.rpartition(".")
    mod = importlib.import_module(module)
    if module == "kinv.kernels.errors" and name in moved.AGENT_ERRORS:
        # an error of kinv's own steps: kinv.kernels cannot import kinv.agent, so the old path names the new one
        with pytest.raises(AttributeError, match=re.escape(f"moved to kinv.agent.errors.{name}")):
            getattr(mod, name)
        assert hasattr(importlib.import_module("kinv.agent.errors"), name)
        return
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        obj = getattr(mod, name)
    said = [str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)]
    if (module, name) in moved.MOVED:
        assert said == [moved.message(module, name)]
        assert "0.5.0" in said[0] and moved.MOVED[(module, name)].public.rpartition(".")[2] in said[0]
    else:
        assert said == [] and obj is not None  # still defined (or imported) where it was


@pytest.mark.parametrize("old", sorted(moved.MOVED), ids=lambda k: ".".join(k))
def test_a_moved_name_is_the_object_its_new_path_names(old):
    module, name = old
    m = moved.MOVED[old]
    with pytest.warns(DeprecationWarning, match=re.escape(f"{module}.{name} is deprecated since 0.3.0")):
        obj = getattr(importlib.import_module(module), name)
    if m.public.startswith("kinv.plugin."):
        assert obj is getattr(kinv.plugin, m.public.rpartition(".")[2])
    elif m.public.startswith("kinv.agent.errors."):
        assert obj == getattr(importlib.import_module("kinv.agent.errors"), m.public.rpartition(".")[2])


def test_the_warning_points_at_the_plugins_import_line(tmp_path, monkeypatch):
    (tmp_path / "old_style.py").write_text("from kinv.kernels.launch_config import Tunable\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(DeprecationWarning) as seen:
        importlib.import_module("old_style")
    assert Path(seen[0].filename).name == "old_style.py" and seen[0].lineno == 1


def test_the_deprecated_resolve_gives_what_the_adapter_resolves():
    from kinv.agent.plan_file import load_plan

    plan, _ = load_plan(str(Path(__file__).resolve().parents[2] / "plans" / "3a-attention-occupancy.yaml"))
    a, level = plan.adapter, plan.levels()[-1]
    cfg = plan.variant_config(plan.variant("V3"))  # an override by batch: resolved differently at each level
    with pytest.warns(DeprecationWarning, match="use KernelAdapter.params_for"):
        from kinv.kernels.launch_config import resolve
    assert dict(resolve(cfg, level)) == dict(a.params_for(cfg, level))


def test_an_unknown_name_is_still_an_attribute_error():
    from kinv.kernels import launch_config

    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        launch_config.Nope  # noqa: B018


# --------------------------------------------------------------------------- #
# kinv check's reading of a plugin's imports
# --------------------------------------------------------------------------- #
PLUGIN = '''
import kinv.kernels.launch_config as lc
from kinv import plugin
from kinv.agent.errors import BadInput, NoRecording
from kinv.agent.plan import Plan
from kinv.kernels import quick
from kinv.kernels.tunables import LaunchParams, brief_repr
from kinv.plugin import KernelAdapter

SPEC = lc.Tunable("X", (1, 2), "x")
'''


def test_the_scan_names_each_private_import_and_its_public_replacement(tmp_path):
    from kinv.agent.tools.runners.plugin_imports import scan

    pkg = tmp_path / "my_plugin"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "adapter.py").write_text(textwrap.dedent(PLUGIN))
    import sys

    sys.modules["my_plugin"] = SimpleNamespace(__path__=[str(pkg)])
    try:
        adapter = type("A", (), {"__module__": "my_plugin.sub.adapter"})()
        lines = scan(adapter)
    finally:
        del sys.modules["my_plugin"]
    f = "my_plugin/sub/adapter.py"
    assert lines == [
        f"{f}:2: private import of kinv.kernels.launch_config: import what the plugin uses from kinv.plugin",
        f"{f}:4: private import from kinv.agent.errors: import BadInput from kinv.plugin; NoRecording has no public "
        "replacement (internal: it may change in any release)",
        f"{f}:5: private import from kinv.agent.plan: Plan has no public replacement (internal: it may change in any "
        "release)",
        f"{f}:6: private import from kinv.kernels: import kernel, from_autotune from kinv.plugin",
        f"{f}:7: DeprecationWarning: {moved.message('kinv.kernels.tunables', 'LaunchParams')}",
        f"{f}:7: private import from kinv.kernels.tunables: import Params from kinv.plugin; brief_repr has no public "
        "replacement (internal: it may change in any release)",
        f"{f}:10: DeprecationWarning: {moved.message('kinv.kernels.launch_config', 'Tunable')}",
    ]  # fmt: skip


def test_kinvs_own_kernels_get_no_import_lines():
    from kinv.agent.tools.runners.plugin_imports import scan
    from kinv.kernels.adapter import get_adapter

    assert scan(get_adapter("mla_decode")) == []
