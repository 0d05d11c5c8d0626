"""The public plugin API, kinv.plugin: its names and every signature pinned to a committed expectation
(tests/plugins/plugin_api.txt), so that a change to them is a decision recorded in CHANGELOG.md, not an accident."""

from __future__ import annotations

import difflib
import inspect
import re
from pathlib import Path

import pytest

import kinv
import kinv.plugin as plugin

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = Path(__file__).with_name("plugin_api.txt")


def _sig(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _members(cls) -> list[str]:
    """A class's own public members: methods with their signatures (abstract ones marked), properties, and
    declared attributes with their annotation and default."""
    out = []
    notes = inspect.get_annotations(cls)
    abstract = getattr(cls, "__abstractmethods__", frozenset())
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            out.append(f"  .{name} (property)")
        elif isinstance(member, (staticmethod, classmethod)) or inspect.isfunction(member):
            fn = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
            out.append(f"  .{name}{_sig(fn)}" + (" (abstract)" if name in abstract else ""))
        elif type(member).__name__ == "member_descriptor":
            out.append(f"  .{name} (read-only)")
        elif name in notes or not callable(member):
            out.append(f"  .{name}: {notes.get(name, type(member).__name__)} = {member!r}")
    out += [f"  .{name}: {notes[name]} (no default)" for name in notes if name not in vars(cls) and not name.startswith("_")]
    return sorted(out)


def api_lines() -> list[str]:
    """The public API as text: ``__all__``, then each name's signature (a class: its constructor and members; an
    error: its bases and exit code)."""
    lines = [f"__all__ = {sorted(plugin.__all__)}"]
    for name in sorted(plugin.__all__):
        obj = getattr(plugin, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            bases = ", ".join(b.__name__ for b in obj.__bases__)
            lines.append(f"{name}({bases}) exit_code={int(obj.exit_code)}")
        elif inspect.isclass(obj):
            lines.append(f"{name}{_sig(obj)}")
            lines += _members(obj)
        else:
            lines.append(f"{name}{_sig(obj)}")
            if name in ("kernel", "from_autotune"):
                lines.append(f"  **options: {', '.join(_quick_options())}")
    return lines


def _quick_options() -> list[str]:
    """The keyword options ``kernel`` and ``from_autotune`` take through ``**options`` (quick's builder's own)."""
    from kinv.kernels import quick

    named = {"name", "module", "tunables", "restrictions", "default", "levels", "make_inputs", "launch", "reference",
             "autotune"}  # fmt: skip
    return sorted(p for p in inspect.signature(quick._build).parameters if p not in named)


def test_the_public_api_is_what_the_committed_expectation_says():
    got, want = api_lines(), EXPECTED.read_text().splitlines()
    diff = "\n".join(difflib.unified_diff(want, got, "plugin_api.txt (committed)", "kinv.plugin (now)", lineterm=""))
    assert got == want, ("the public plugin API changed; if that is a decision, write the new lines into "
                         f"tests/plugins/plugin_api.txt and record the change in CHANGELOG.md:\n{diff}")


def test_every_public_name_is_documented_and_exported_once():
    doc = (ROOT / "docs" / "plugin-api.md").read_text()
    assert len(plugin.__all__) == len(set(plugin.__all__))
    missing = [n for n in plugin.__all__ if f"`{n}`" not in doc]
    assert not missing, f"docs/plugin-api.md does not document {missing}"
    for name in plugin.__all__:
        assert getattr(plugin, name) is not None


def test_the_public_names_are_the_objects_kinv_itself_uses():
    """One class per name: a plugin's KernelAdapter subclass, and the errors it raises, are the ones kinv checks for."""
    from kinv.kernels import adapter, errors, quick, tunables

    assert plugin.KernelAdapter is adapter.KernelAdapter and plugin.Params is tunables.Params
    assert plugin.kernel is quick.kernel and plugin.from_autotune is quick.from_autotune
    assert plugin.BadInput is errors.BadInput and plugin.ConfigError is errors.ConfigError
    assert plugin.StepFailed is errors.StepFailed and plugin.KinvError is errors.KinvError
    assert issubclass(plugin.ConfigError, plugin.BadInput) and issubclass(plugin.BadInput, ValueError)


def test_the_version_is_the_same_everywhere_and_the_changelog_records_it():
    pyproject = (ROOT / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1)
    assert kinv.__version__ == version == "0.3.0"
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## {version}" in changelog and "kinv.plugin" in changelog


@pytest.mark.parametrize("name", ["occupancy", "get_device", "check_level_values", "kernel", "from_autotune"])
def test_each_public_function_keeps_its_pinned_signature(name):
    """The functions one by one (the expectation file holds them all): a plugin calls them by keyword."""
    pinned = [ln for ln in EXPECTED.read_text().splitlines() if ln.startswith(f"{name}(")]
    assert pinned == [f"{name}{_sig(getattr(plugin, name))}"]
