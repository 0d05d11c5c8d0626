"""Reading a plan file safely: a bounded YAML loader, one line for what is wrong, the plan validated whole."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import ValidationError

from kinv.agent.errors import PlanError, TooBig
from kinv.agent.plan import Plan, first_error
from kinv.kernels.tunables import brief_repr, one_line, read_text_file

MAX_PLAN_BYTES = 256 * 1024
REFERENCE_LINK = "(every plan field, its limits and an example: docs/plan-reference.md)"


def load_plan(path: str | Path) -> tuple[Plan, str]:
    """Read and validate a YAML plan; returns (plan, content hash) or raises PlanError (one line)."""
    try:
        return _load_plan(Path(path))
    except PlanError as exc:
        raise PlanError(f"{one_line(str(exc))} {REFERENCE_LINK}") from None


def _load_plan(path: Path) -> tuple[Plan, str]:
    import yaml

    if path.is_dir():
        raise PlanError(f"plan file {path} is a directory; give a YAML file such as plans/3a-attention-occupancy.yaml")
    if not path.is_file():
        raise PlanError(f"plan file {path} does not exist (plans live in plans/, e.g. plans/3a-attention-occupancy.yaml)")
    text = read_text_file(path, "plan file", MAX_PLAN_BYTES, PlanError)
    try:
        data = yaml.load(text, Loader=_BoundedLoader)
    except TooBig as exc:
        raise PlanError(f"plan file {path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise PlanError(f"plan file {path} is not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise PlanError(f"plan file {path} is not a usable plan: its YAML nests too deeply") from None
    except Exception as exc:  # noqa: BLE001 - PyYAML's constructors raise anything on odd tagged values:
        # ValueError (!!int x, a 5000-digit number), AttributeError (!!timestamp 1-1-1), TypeError, ...
        if "integer string conversion" in str(exc):
            said = "a number has more than 4300 digits"
        elif isinstance(exc, ValueError) and str(exc).strip():
            said = f"a value cannot be read: {str(exc).splitlines()[0]}"
        else:
            said = "a value cannot be read as its type or tag (a bad date, !!int, !!binary, ...?)"
        raise PlanError(f"plan file {path} is not valid YAML: {said}") from None
    if not isinstance(data, dict):
        raise PlanError(f"plan file {path} must be a YAML mapping with keys workstream, kernel, hypothesis, ...")
    _beside_the_plan(path, data.get("kernel"))
    try:
        plan = Plan.model_validate(data)
    except ValidationError as exc:
        raise PlanError(f"plan file {path}: {first_error(exc)}") from None
    except RecursionError:
        raise PlanError(f"plan file {path} is not a usable plan: it nests too deeply") from None
    except (ValueError, TypeError, OverflowError) as exc:
        raise PlanError(f"plan file {path}: {str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__}") from None
    return plan, hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _beside_the_plan(path: Path, kernel) -> None:
    """A plan that names its adapter's class (``kernel: mypkg.adapter:MyKernel``) and sits beside that package (a
    plugin's own folder) finds it there, installed or not: the folder joins the import path (after what is on it)."""
    import sys

    from kinv.kernels.adapter import REF

    if not isinstance(kernel, str) or not REF.fullmatch(kernel):
        return
    folder = path.resolve().parent
    top = kernel.split(".", 1)[0].split(":", 1)[0]
    if (folder / top).is_dir() and str(folder) not in sys.path:
        sys.path.append(str(folder))


def _make_loader():
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        """SafeLoader that refuses alias expansion bombs ("billion laughs")."""

        max_nodes = 20000
        max_depth = 32  # a plan nests 7 levels; deeper is garbage (and would cost stack and scanner time)

        def __init__(self, stream):
            super().__init__(stream)
            self._nodes = 0
            self._depth = 0

        def construct_object(self, node, deep=False):
            self._nodes += 1
            if self._nodes > self.max_nodes:
                raise TooBig(f"YAML expands to more than {self.max_nodes} nodes (anchors/aliases bomb?)")
            return super().construct_object(node, deep=deep)

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                self._nodes += 50
                if self._nodes > self.max_nodes:
                    raise TooBig(f"YAML uses too many aliases (more than {self.max_nodes // 50})")
            self._depth += 1
            try:
                if self._depth > self.max_depth:
                    raise TooBig(f"YAML nests deeper than {self.max_depth} levels")
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def compose_mapping_node(self, anchor):
            node = super().compose_mapping_node(anchor)
            seen = set()
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if (key.tag, key.value) in seen:
                        raise yaml.constructor.ConstructorError(
                            "while reading a mapping", node.start_mark,
                            f"found duplicate key {brief_repr(key.value)}", key.start_mark)  # fmt: skip
                    seen.add((key.tag, key.value))
            return node

    return BoundedLoader


class _LazyLoader:
    _cls = None

    def __call__(self, stream):
        if _LazyLoader._cls is None:
            _LazyLoader._cls = _make_loader()
        return _LazyLoader._cls(stream)


_BoundedLoader = _LazyLoader()
