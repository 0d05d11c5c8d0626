"""docs/plan-reference.md is the plan model's own account of itself: generated from agent/plan.py, and current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel

from kinv.agent.plan import Plan
from kinv.agent.plan_reference import render

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "plan-reference.md"


def _paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    import typing

    out = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        out.append(path)
        for a in (info.annotation, *typing.get_args(info.annotation)):
            if isinstance(a, type) and issubclass(a, BaseModel):
                sep = "[]." if typing.get_origin(info.annotation) is list else "."
                out += _paths(a, path + sep)
    return out


def test_the_committed_reference_is_the_one_the_model_generates():
    assert REFERENCE.read_text() == render(), (
        "docs/plan-reference.md is stale: run `python -m kinv.agent.plan_reference > docs/plan-reference.md`"
    )


def test_every_field_of_a_plan_is_documented_with_its_meaning():
    text = REFERENCE.read_text()
    for path in _paths(Plan):
        assert f"- **`{path}`**:" in text, path
    undescribed = [p for p in _paths(Plan) if not _field(p).description]
    assert not undescribed, f"plan fields without a description (Field(description=...)): {undescribed}"


def _field(path: str):
    import typing

    model: type[BaseModel] = Plan
    *parents, last = path.replace("[]", "").split(".")
    for name in parents:
        ann = model.model_fields[name].annotation
        model = next(a for a in (ann, *typing.get_args(ann)) if isinstance(a, type) and issubclass(a, BaseModel))
    return model.model_fields[last]


def test_the_reference_states_the_limits_a_plan_is_held_to():
    text = REFERENCE.read_text()
    line = lambda path: " ".join(text.split(f"- **`{path}`**:", 1)[1].split("\n- ", 1)[0].split())  # noqa: E731
    assert "default: `16`; >= 8, <= 200" in line("stats.aa_rounds")
    assert "> 0, <= 0.5" in line("stats.threshold")
    # bounds: allowed values per tunable, refused outside them under every approval policy
    bounds = line("bounds")
    assert "refused under every approval policy" in bounds and "auto-config" in bounds
    assert "Example: `{BLOCK_T: [16, 32, 64]" in bounds


def test_the_reference_is_printed_by_its_module():
    r = subprocess.run([sys.executable, "-m", "kinv.agent.plan_reference"], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout == REFERENCE.read_text()


def test_bounds_is_a_list_of_allowed_values_as_the_reference_says(tmp_path, monkeypatch):
    """A variant's value outside bounds is refused when the plan is read, before any approval policy applies."""
    import pytest
    import yaml

    from kinv.agent.errors import PlanError
    from kinv.agent.plan_file import load_plan

    monkeypatch.chdir(ROOT)
    plan = yaml.safe_load((ROOT / "plans" / "3a-attention-occupancy.yaml").read_text())
    plan["bounds"]["num_warps"] = [4]  # a list of values, not a range: 8 lies outside it
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(plan))
    with pytest.raises(PlanError, match=r"num_warps=8 is not among the plan's bounds.num_warps \[4\]"):
        load_plan(path)


def _plan_with(tmp_path, **changes):
    import yaml

    plan = yaml.safe_load((ROOT / "plans" / "3a-attention-occupancy.yaml").read_text())
    plan.update(changes)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(plan))
    return path


def test_allowed_takes_values_or_a_range_and_bounds_is_its_old_spelling(tmp_path, monkeypatch):
    import pytest

    from kinv.agent.errors import PlanError
    from kinv.agent.plan_file import load_plan

    monkeypatch.chdir(ROOT)
    old = load_plan(_plan_with(tmp_path))[0]  # the shipped plan, written with bounds: still valid, same meaning
    bounds = old.bounds
    ranged = {k: {"min": min(v), "max": max(v)} for k, v in bounds.items()}
    plan = load_plan(_plan_with(tmp_path, bounds=None, allowed=ranged))[0]
    assert set(plan.allowed_values()) == set(bounds) and plan.allowed_values()["num_warps"] == [4, 8]
    with pytest.raises(PlanError, match="give allowed or its old spelling bounds, not both"):
        load_plan(_plan_with(tmp_path, allowed={"num_warps": [4, 8]}))
    # a list is the values themselves: the error says how a range is written, and where every field is described
    with pytest.raises(PlanError) as exc:
        load_plan(_plan_with(tmp_path, bounds={"num_warps": [4, 6]}))
    assert "for a range write {min: 4, max: 6}" in str(exc.value) and "docs/plan-reference.md" in str(exc.value)
    with pytest.raises(PlanError, match="no value of num_warps lies from 5 to 7"):
        load_plan(_plan_with(tmp_path, bounds=None, allowed={"num_warps": {"min": 5, "max": 7}}))
