"""The plan reference (docs/plan-reference.md), generated from the plan model itself.

Every field of :class:`kinv.agent.plan.Plan` and of the sections it nests, with its type, default, limits
(read from the field's constraints), its description (the same text a validation error draws on), the rules
that span fields (:data:`RULES`, kept beside the validators they describe) and an example value taken from the
plans kinv ships.  Then the ``workload:`` section of each of kinv's own kernels, from its adapter's model.

    python -m kinv.agent.plan_reference > docs/plan-reference.md
"""

from __future__ import annotations

import sys
import textwrap
import types
import typing
from pathlib import Path

import annotated_types as at
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 115
# where the examples come from, in this order: the first plan that sets a field gives its example
EXAMPLE_PLANS = ("plans/3a-attention-occupancy.yaml", "plans/7-decode-ceiling.yaml", "plans/3c-null-batch-aware.yaml",
                 "plans/3e-target-ctas.yaml", "plans/13-target-ctas-search.yaml", "plans/cpu-matmul-threads.yaml",
                 "plans/6b-source-null.yaml", "examples/quick_matmul/plan.yaml")  # fmt: skip
# the plan each of kinv's own kernels takes its workload examples from
WORKLOAD_EXAMPLES = {"command": "plans/cpu-matmul-threads.yaml", "mla_decode": "plans/3a-attention-occupancy.yaml",
                     "moe_expert_gemm": "plans/4a-expert-gemm-tiles.yaml"}  # fmt: skip

# rules that span fields or call the kernel's adapter: what the validators in agent/plan.py and
# agent/plan_sections.py enforce
# fmt: off
RULES: dict[str, str] = {
    "": "Every section is strict: an unknown key is refused, and a value must have the field's own type (no "
        "\"64\" for 64, no true for 1, no 4.0 for 4). A plan file is a YAML mapping of at most 256 KiB.",
    "workstream.id": "A number and an optional letter, such as '#3a' (the '#' may be left out).",
    "workstream.parent": "A workstream id, as for workstream.id.",
    "workstream.title": "One line with no control characters.",
    "kernel": "Refused unless `kinv kernels` lists it or the module:Class imports (installed, from the working "
              "directory, or from the plan's own folder when the package sits beside it); the error names the valid "
              "ones.",
    "device": "Refused unless kinv knows the device (the error lists the known ones).",
    "hypothesis": "No control characters other than newlines and tabs.",
    "workload": "Validated by the kernel adapter's workload model: see \"The workload of kinv's own kernels\".",
    "environment": "Names of A-Z, 0-9 and _ (at most 64 characters), values of at most 256 characters without NUL, "
                   "and the kernel's own rule for them (mla_decode's TARGET_CTAS must be a positive integer).",
    "baseline": "Must be a valid config of the kernel: every value one the tunable allows, and the kernel's "
                "restrictions between tunables met.",
    "variants": "At least one variant unless the plan has a campaign: section; ids distinct.",
    "variants[].id": "A letter, then letters, digits, '_' or '-' (32 characters at most).",
    "variants[].patch": "Keys are the kernel's tunables or `overrides`; the baseline with the patch applied must be "
                        "a valid config; where allowed (or bounds) names a key, the patch's value (its overrides' "
                        "included) must be one it allows, under every approval policy.",
    "variants[].args": "Only in a command plan: keys are the workload's args (the command's '{name}' "
                       "placeholders); the variant's runs get the command line with these values.",
    "variants[].source_patch": "A relative path under plans/ or kernels/ (no '..'), found from the working directory "
                               "or the kernel adapter's root, holding a unified diff (--- a/FILE, +++ b/FILE, @@).",
    "variants[].env": "The same rules as environment; the variant's processes get the plan's environment with "
                      "these values on top.",
    "variants[].requires.variant": "Must name an earlier variant of the plan.",
    "variants[].targets": "One of occupancy, pipelining, tile_shape, parallelism, bytes_moved, roofline_gap, "
                          "elsewhere, or a premise the kernel's adapter declares (KernelAdapter.premises); the error "
                          "lists the valid ones. For each decided variant the close-out reads the premise's "
                          "quantity, baseline and variant, from the compiled resources and the profile; a variant "
                          "that did not move it (or moved it the other way) at a level says nothing about the "
                          "hypothesis there.",
    "variants[].expect": "The hypothesis is called supported or refuted only by variants that moved their premise; "
                         "each variant's line says where its prediction held.",
    "allowed": "Keys must be the kernel's tunables; a list's every value one the tunable allows, a range "
               "({min, max}) at least one. In full: (1) plan validation refuses a variant whose patch, or any of its "
               "overrides, sets a named tunable to a value not allowed, under every approval policy (ask, "
               "auto-config and auto alike); (2) under --approval auto-config, a config edit whose named values are "
               "all allowed needs no approval (a source patch always does); (3) a campaign with no campaign.space "
               "searches these values. A tunable allowed does not name is not limited by it.",
    "bounds": "Read exactly as allowed (plans written before the rename stay valid): refused under every approval "
              "policy outside its values, no approval needed under auto-config inside them, searched by a campaign "
              "without campaign.space. A list is the values allowed, not a range: [64, 2048] refuses 256.",
    "stats.level_thresholds": "Keys must be level labels of the workload (b32, n512, ...); each value in (0, 0.5].",
    "stats.quick_rounds": "Must not exceed stats.max_rounds.",
    "expect_levels": "Level labels of the workload; only with expect: no_change.",
    "backlog[].id": "As variants[].id.",
    "backlog[].tunables": "The kernel's tunables; give tunables or env, not both.",
    "backlog[].targets": "As variants[].targets. An item whose premise the plan's variants aimed at but none moved "
                         "keeps its prior, and the recommendation proposes the variants that would test it.",
    "backlog[].env": "Distinct values per variable, each valid as in environment.",
    "campaign": "A campaign searches campaign.space, or the plan's allowed values when that is empty; one of them, or a "
                "backlog item with env values, must be non-empty. The backlog needs at least one item with tunables "
                "inside that space, or with env values.",
    "campaign.space": "Keys must be the kernel's tunables, each with at least one value the tunable allows.",
    "campaign.goal": "Give copy_fraction or roofline_fraction, not both.",
    "campaign.goal.levels": "Level labels of the workload.",
}
# fmt: on


def _type(ann) -> str:
    """A field's type in words."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return " or ".join(_type(a) for a in inner) + (" or null" if len(inner) < len(args) else "")
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"list of {_type(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping of {_type(args[0])} to {_type(args[1])}" if args else "mapping"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "section"
    return {str: "text", int: "integer", float: "number", bool: "true or false", dict: "mapping"}.get(ann, str(ann))


def _limits(info, ann) -> str:
    words = []
    unit = "item" if typing.get_origin(ann) in (list, dict) else "character"
    for m in info.metadata:
        for cls, attr, say in ((at.Ge, "ge", ">="), (at.Gt, "gt", ">"), (at.Le, "le", "<="), (at.Lt, "lt", "<")):
            if isinstance(m, cls):
                words.append(f"{say} {getattr(m, attr)}")
        if isinstance(m, at.MinLen):
            words.append(f"at least {m.min_length} {unit}{'s' * (m.min_length != 1)}")
        if isinstance(m, at.MaxLen):
            words.append(f"at most {m.max_length} {unit}s")
    return ", ".join(words)


def _default(info) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        value = info.default_factory()
        return "default: empty" if value in ({}, []) else "default: the section's own defaults"
    if info.default is None:
        return "default: none"
    if info.default is PydanticUndefined:
        return "required"
    return f"default: `{_yaml(info.default)}`"


def _yaml(value) -> str:
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000, allow_unicode=True).strip()
    text = text.removesuffix("\n...").strip()
    return text if len(text) <= 90 else text[:87] + "..."


def _model_of(ann) -> type[BaseModel] | None:
    """The nested section of a field (a model, a list of models or an optional model), if any."""
    for a in (ann, *typing.get_args(ann)):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _examples(paths=EXAMPLE_PLANS) -> dict[str, tuple[str, str]]:
    """dotted field path -> (its value in the first plan that sets it, that plan's file name)."""
    import yaml

    out: dict[str, tuple[str, str]] = {}

    def walk(prefix: str, value, where: str):
        if prefix and prefix not in out:
            out[prefix] = (_yaml(value), where)
        if isinstance(value, dict) and not prefix.endswith(("patch", "env")):
            for k, v in value.items():
                if prefix in ("environment", "bounds", "allowed", "baseline", "campaign.space", "stats.level_thresholds"):
                    continue
                walk(f"{prefix}.{k}" if prefix else str(k), v, where)
        elif isinstance(value, list) and value and all(isinstance(x, dict) for x in value) and prefix:
            for x in value:
                walk(f"{prefix}[]", x, where)

    for rel in paths:
        walk("", yaml.safe_load((ROOT / rel).read_text()), Path(rel).name)
    for key in [k for k in out if k.endswith("[]")]:
        del out[key]
    return out


def _fields(model: type[BaseModel], prefix: str, examples: dict, lines: list[str], sections: list, rules: bool) -> None:
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        ann = info.annotation
        nested = _model_of(ann)
        head = f"- **`{path}`**: {_type(ann)}; {_default(info)}"
        limits = _limits(info, ann)
        if limits:
            head += f"; {limits}"
        said = (info.description or "").strip()
        text = head + "." + (f" {said[:1].upper()}{said[1:]}" + ("" if said.endswith(".") else ".") if said else "")
        if path in RULES and rules:
            text += " " + RULES[path]
        if nested is not None:
            inner = f"{path}[]." if typing.get_origin(ann) is list else f"{path}."
            text += f" Its fields: `{inner}*` below."
            sections.append((path, nested, inner))
        elif path in examples:
            value, where = examples[path]
            text += f" Example: `{value}` ({where})."
        lines += textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)


def _section(
    title: str,
    model: type[BaseModel],
    prefix: str,
    examples: dict,
    lines: list[str],
    level: str = "##",
    rules: bool = True,
) -> None:
    """One section's fields, then each section it nests; ``rules``: the plan's own (not an adapter's workload)."""
    lines += ["", f"{level} {title}", ""]
    key = prefix.rstrip(".").removesuffix("[]")
    if rules and prefix and key in RULES:
        lines += textwrap.wrap(RULES[key], WIDTH) + [""]
    sections: list = []
    _fields(model, prefix, examples, lines, sections, rules)
    for path, nested, inner in sections:
        _section(f"`{path}`", nested, inner, examples, lines, level, rules)


def render() -> str:
    from kinv.agent.plan import Plan
    from kinv.kernels.adapter import BUILTIN, get_adapter

    examples = _examples()
    lines = ["# Plan reference", "",
             "<!-- generated by `python -m kinv.agent.plan_reference > docs/plan-reference.md`: edit the field "
             "descriptions in agent/plan.py and agent/plan_sections.py and run it again -->", ""]  # fmt: skip
    lines += textwrap.wrap(
        "A plan is a YAML file that `kinv run` (one workstream) or `kinv campaign` (a chain of them) reads. Every "
        "field below comes from the plan model in agent/plan.py and agent/plan_sections.py: its type, its default, its limits and what it "
        "means. Examples are taken from the plans in plans/. " + RULES[""],
        WIDTH,
    )
    lines += ["", "A whole plan, `plans/3a-attention-occupancy.yaml`, the seed's investigation:", "", "```yaml"]
    lines += (ROOT / "plans" / "3a-attention-occupancy.yaml").read_text().rstrip("\n").splitlines()
    lines += ["```"]
    _section("Top level", Plan, "", examples, lines)
    lines += ["", "## The workload of kinv's own kernels", ""]
    lines += textwrap.wrap(
        "The `workload:` section is the kernel adapter's own model "
        "(`KernelAdapter.workload_model`): a plugin defines its own. These are the models of the "
        "kernels kinv ships.",
        WIDTH,
    )
    for name in sorted(BUILTIN):
        plan = WORKLOAD_EXAMPLES[name]
        _section(
            f"`kernel: {name}` (examples from `{plan}`)",
            get_adapter(name).workload_model(),
            "workload.",
            _examples((plan,)),
            lines,
            "###",
            rules=False,
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
