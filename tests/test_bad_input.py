"""Bad input, generated: plan files (`kinv run`), config files (`kinv bench --config`) and command-line
arguments (`kinv bench --variant/--plan/...`, `kinv noise`, `kinv run`).

Every input here is bad.  Each must give exit code 2, exactly one stderr line
``kinv: ...`` that names the file and the field (or says YAML/JSON/...), or for an
argument the bad value, no traceback, no state dir, the live config copy
byte-identical, and nothing under the repo's kernels/ changed.

Inputs come from hypothesis strategies that mutate the valid plan
(plans/3a-attention-occupancy.yaml, with a ``stats.level_thresholds`` added) and
the valid config (kernels/configs/mla_decode.json), and from raw-text generators
(YAML bombs, deep nesting, binary garbage, ...).  The kernel's tunables are its
adapter's (``get_adapter("mla_decode").spec``); plan errors read like
``workload.model.attention_tp: ...`` or ``variants.V1.patch: unknown key ...``.
Categories built to be invalid by construction ("strict") assert that the
validator refuses them; categories that might, by chance, produce a valid input
("filtered": e.g. a wrong-typed value that happens to be allowed) drop those
with ``hypothesis.reject`` and count them.  The CLI runs in-process (fast: a bad plan fails before torch, triton
or the graph run); one subprocess test checks the same inputs through a real
process.  The last test asserts that >= 1000 inputs ran and prints the
breakdown (``pytest -rP tests/test_bad_input.py`` shows it).
"""

from __future__ import annotations

import atexit
import copy
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from kinv.agent.cli import main
from kinv.agent.models import MAX_PLAN_BYTES, load_plan
from kinv.kernels.adapter import get_adapter
from kinv.kernels.launch_config import load_config
from tests.utils import SEED_MLA_CONFIG, write_seed_config

pytestmark = pytest.mark.slow  # the slow lane: kills, races, fuzzing, drills (python -m pytest -m slow)

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "plans" / "3a-attention-occupancy.yaml"
CONFIG = ROOT / "kernels" / "configs" / "mla_decode.json"
MLA = get_adapter("mla_decode")
PARAMS = MLA.spec.required()  # the kernel's required tunables: BLOCK_T, BLOCK_H, num_warps, num_stages
BASE_PLAN = yaml.safe_load(PLAN.read_text())
BASE_PLAN["stats"]["level_thresholds"] = {"b1": 0.02}  # so that mutations reach it too
BASE_CONFIG = json.loads(SEED_MLA_CONFIG)  # the seed's config file, the one #3a was written against
TOP_KEYS = tuple(BASE_PLAN)
LABELS = tuple(f"b{b}" for b in BASE_PLAN["workload"]["levels"])  # the workload's level labels

COUNTS: Counter = Counter()  # category -> inputs that ran through the CLI
FILTERED: Counter = Counter()  # category -> generated inputs that were valid after all (dropped)
SAMPLES: dict = {}  # category -> a few of the messages, to read
LIVE: dict = {}  # the live config copy (KINV_CONFIG_DIR) of this module


def settings_for(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None, print_blob=False,
                    suppress_health_check=list(HealthCheck))  # fmt: skip


# --------------------------------------------------------------------------- #
# sandbox: live config copy, repo hashes, env
# --------------------------------------------------------------------------- #
def repo_hashes() -> dict[str, str]:
    files = sorted((ROOT / "kernels" / "configs").glob("*.json")) + sorted((ROOT / "kernels").glob("*.py"))
    return {str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture(scope="module", autouse=True)
def sandbox():
    before = repo_hashes()
    d = Path(tempfile.mkdtemp(prefix="kinv-bad-live-"))
    (d / "configs").mkdir()
    write_seed_config(d / "configs")
    LIVE["path"] = d / "configs" / "mla_decode.json"
    LIVE["bytes"] = LIVE["path"].read_bytes()
    LIVE["repo_before"] = before
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KINV_CONFIG_DIR", str(d / "configs"))
        mp.setenv("KINV_FORCE_NO_GPU", "1")
        mp.setenv("TRITON_INTERPRET", "1")
        mp.delenv("KINV_DEBUG", raising=False)
        yield
    shutil.rmtree(d, ignore_errors=True)
    assert repo_hashes() == before, "a bad input changed a file under kernels/"


@contextmanager
def scratch():
    d = Path(tempfile.mkdtemp(prefix="kinv-bad-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def call_cli(argv: list[str]) -> tuple[object, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = main(argv)
        except BaseException as exc:  # noqa: BLE001 - the CLI must never raise
            rc = f"raised {type(exc).__name__}: {exc!r}"[:500]
    return rc, out.getvalue(), err.getvalue()


def is_valid(cmd: str, path: Path) -> bool:
    try:
        if cmd == "run":
            load_plan(path)
        else:
            load_config(path, "mla_decode")
    except Exception:  # any refusal; the CLI check below says whether it was a clean one
        return False
    return True


def expect_rejected(cmd: str, data: bytes | str, category: str, needles=(), strict: bool = False) -> str:
    """Run the CLI on ``data`` and check the one-line, exit-2, no-writes contract."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    with scratch() as d:
        f = d / ("input.yaml" if cmd == "run" else "input.json")
        f.write_bytes(data)
        if not strict and is_valid(cmd, f):  # strict inputs are invalid by construction: the CLI check proves it
            FILTERED[category] += 1
            reject()
        state = d / "state"
        if cmd == "run":
            argv = ["run", str(f), "--backend", "replay", "--approval", "auto", "--state-dir", str(state)]
        else:
            argv = ["bench", "--plan", str(PLAN), "--config", str(f), "--backend", "replay", "--state-dir", str(state)]
            argv += ["--json"] if COUNTS[category] % 2 else []  # --json: the backend's banner must not precede it
        line = refused_cleanly(argv, state, f"[{category}] input {data[:200]!r}...", needles, str(f))
    COUNTS[category] += 1
    if COUNTS[category] % 25 == 1:
        SAMPLES.setdefault(category, []).append(line.replace(str(f), f.name))
    return line


def refused_cleanly(argv: list[str], state: Path, what: str, needles=(), names: str | None = None,
                    all_needles=()) -> str:  # fmt: skip
    """Run the CLI and check the contract: exit 2, one printable ``kinv: `` line on stderr naming ``names``
    and one of ``needles`` (and every one of ``all_needles``), no traceback, no state dir, live config intact."""
    saved = os.environ.get("KINV_STATE_DIR")
    os.environ["KINV_STATE_DIR"] = str(state)
    box_before, repo_state_before = listing(state.parent), listing(ROOT / "state")
    try:
        rc, out, err = call_cli(argv)
    finally:
        if saved is None:
            os.environ.pop("KINV_STATE_DIR", None)
        else:
            os.environ["KINV_STATE_DIR"] = saved
    what = f"{what}\nargv={[a[:200] for a in argv]!r}\nrc={rc!r}\nstderr={err[:1000]!r}\nstdout={out[-500:]!r}"
    assert "Traceback" not in out + err, what
    assert rc == 2, what
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n") and err.count("\n") == 1, what
    line = lines[0]
    assert line.startswith("kinv: ") and len(line) > 20 and len(line) <= 800, what
    assert line.isprintable(), what
    if names is not None:
        assert names in line, f"message does not name {names!r}: {what}"
    if needles:
        assert any(n in line for n in needles), f"message names none of {needles}: {what}"
    missing = [n for n in all_needles if n not in line]
    assert not missing, f"message does not name {missing}: {what}"
    assert not state.exists(), f"state dir was written: {what}"
    assert listing(state.parent) == box_before, f"a file was created or changed: {what}"
    assert listing(ROOT / "state") == repo_state_before, f"./state of the checkout was written: {what}"
    assert LIVE["path"].read_bytes() == LIVE["bytes"], f"live config changed: {what}"
    return line


def listing(d: Path) -> dict[str, bytes | None]:
    """Every path under ``d`` with its bytes (None for a directory): what a refused command must not change."""
    if not d.exists():
        return {}
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() else None) for p in sorted(d.rglob("*"))}


# --------------------------------------------------------------------------- #
# helpers on nested dicts/lists
# --------------------------------------------------------------------------- #
def paths_of(obj, prefix=()):
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += paths_of(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += paths_of(v, prefix + (i,))
    return out


def get_at(obj, path):
    for p in path:
        obj = obj[p]
    return obj


def set_at(obj, path, value):
    get_at(obj, path[:-1])[path[-1]] = value


def del_at(obj, path):
    del get_at(obj, path[:-1])[path[-1]]


def dump_plan(plan) -> str:
    return yaml.safe_dump(plan, allow_unicode=True, sort_keys=False, width=10**9)


def field_needles(path) -> tuple[str, ...]:
    return tuple(str(p) for p in path if isinstance(p, str) and p.isidentifier())[:1] or (
        "unknown key",
        "Keys should be strings",
    )


ALL_PATHS = paths_of(BASE_PLAN)
NUMERIC_PATHS = [p for p in ALL_PATHS if type(get_at(BASE_PLAN, p)) in (int, float)]
MAPPING_PATHS = [()] + [p for p in ALL_PATHS if isinstance(get_at(BASE_PLAN, p), dict)]
N_VARIANTS, N_BACKLOG = len(BASE_PLAN["variants"]), len(BASE_PLAN["backlog"])

# strings with a grammar (ids, names, enums): weird unicode in them must be refused
CONSTRAINED_STRINGS = (
    [("workstream", "id"), ("workstream", "parent"), ("kernel",), ("device",), ("workload", "model", "shape"),
     ("environment", "TARGET_CTAS"), ("variants", 2, "requires", "variant"), ("variants", 0, "targets")]
    + [("variants", i, "id") for i in range(N_VARIANTS)]
    + [("backlog", i, "id") for i in range(N_BACKLOG)] + [("backlog", i, "targets") for i in range(N_BACKLOG)]
)  # fmt: skip
# free text with a length limit: too much unicode must be refused
LIMITED_STRINGS = {("workstream", "title"): 200, ("hypothesis",): 4000, ("variants", 0, "title"): 200,
                   ("variants", 1, "rationale"): 2000, ("backlog", 0, "rationale"): 2000}  # fmt: skip
REQUIRED = (
    [(k,) for k in ("workstream", "kernel", "hypothesis", "workload", "baseline", "variants")]
    + [("workstream", "id"), ("workstream", "title"), ("workload", "levels"), ("variants", 2, "requires", "variant")]
    + [("baseline", k) for k in PARAMS]
    + [("variants", i, k) for i in range(N_VARIANTS) for k in ("id", "title")]
    + [("backlog", i, k) for i in range(N_BACKLOG) for k in ("id", "title", "rationale", "targets")]
    + [("variants", 2, "patch", "overrides", j, "num_warps") for j in (0, 1)]
)  # fmt: skip
OPTIONAL = [("device",), ("environment",), ("bounds",), ("stats",), ("budget",), ("backlog",),
            ("workstream", "parent"), ("workstream", "parent_title"), ("workload", "model"),
            ("workload", "model", "heads"), ("workload", "model", "attention_tp"), ("workload", "model", "shape"),
            ("workload", "context"), ("workload", "page_size"), ("stats", "threshold"),
            ("stats", "level_thresholds"), ("stats", "aa_rounds"), ("stats", "aa_arms"), ("budget", "wall_seconds"),
            ("variants", 0, "rationale"), ("variants", 0, "targets"), ("variants", 1, "patch"),
            ("variants", 2, "requires"), ("backlog", 3, "prior")]  # fmt: skip

# --------------------------------------------------------------------------- #
# value strategies
# --------------------------------------------------------------------------- #
WEIRD_TEXT = [
    "\u202eV1", "V1\u200b", "\uff36\uff11", "V1\x00", "\x00", "\U0001f525", "V1\U0001f525", "mla_decode\u200d",
    "mla\u2028decode", "\u210c200", "sm_\uff19\uff10", "SM_90\u0301", "\ufeffV1", "V\u0131", "\u212a", "\ufb01",
    "\x00\x01\x02", "#\uff13a", "#3a\n", "V1\n", " V1", "V1 ", "", "\U0001f600" * 10, "\u0627" * 5,
    "\u05d0V1", "\u200f#3a", "\x85", "\t", "\u0412\u0031", "occupancy\u00a0", "v4fla\u0455h", "\ud7ff", "\uffff",
    "e\u0301", "\u00e9", "TARGET_CTAS\u200b", "\u0665\u0661\u0662", "\uff15\uff11\uff12", "5_12", " 512", "512\n",
    "\U000e0041", "\u1680", "\u3000", "\x1b[31mred\x1b[0m", "\r\n", "\\u0000",
]  # fmt: skip
HUGE = [1e308, -1e308, 1.7976931348623157e308, 10**30, -(10**30), 10**300, -(10**300), float("nan"), float("inf"),
        float("-inf"), 2**63, 2**64, -(2**63), 2**31, 10**4000, 5e-324, -5e-324, 1e-300, 1 << 20 + 1]  # fmt: skip

scalars = st.one_of(
    st.text(max_size=12), st.integers(-(10**6), 10**6), st.floats(), st.booleans(), st.none(),
    st.sampled_from(WEIRD_TEXT), st.sampled_from(HUGE),
)  # fmt: skip
any_value = st.one_of(scalars, st.lists(scalars, max_size=4), st.dictionaries(st.text(max_size=8), scalars, max_size=3))
unicode_text = st.one_of(
    st.sampled_from(WEIRD_TEXT),
    st.text(min_size=1, max_size=24).filter(lambda s: not s.isascii()),
    st.text(alphabet=st.characters(min_codepoint=0x80, max_codepoint=0x10FFFF, exclude_categories=("Cs",)),
            min_size=1, max_size=8),
)  # fmt: skip
keys = st.one_of(
    st.text(min_size=1, max_size=16), unicode_text.filter(bool), st.integers(-5, 5),
    st.sampled_from(["__proto__", "kernel ", "Kernel", "KERNEL", "workstream\u200b", "\uff4b\uff45\uff52\uff4e\uff45\uff4c",
                     "variant", "extra", "$ref", "<<", "\U0001f525", "\u202ekernel", "null", "num_warps\x00",
                     "BLOCK_\u0422", "num_warps ", "batch_max", "overrides ", "TARGET_CTAS\n", "a" * 300]),
)  # fmt: skip


_WRONG: dict = {}


def wrong_type_for(old):
    """Values of another type than ``old`` (one strategy per type: hypothesis builds it once)."""
    kind = type(old)
    if kind not in _WRONG:
        _WRONG[kind] = any_value.filter(_other_type(old))
    return _WRONG[kind]


def _other_type(old):
    def bad(v):
        if isinstance(old, bool) or isinstance(v, bool):
            return type(v) is not type(old)
        if isinstance(old, int | float) and isinstance(v, int | float):
            return type(v) is not type(old) and not (isinstance(old, float) and isinstance(v, int))
        if old is None:
            return v is not None
        return type(v) is not type(old)

    return bad


# --------------------------------------------------------------------------- #
# plan mutations
# --------------------------------------------------------------------------- #
def test_the_bases_are_valid(tmp_path):
    """The plan and config every input mutates are valid: each refusal below is the mutation's."""
    f = tmp_path / "base.yaml"
    f.write_text(dump_plan(BASE_PLAN))
    plan, _ = load_plan(f)
    assert [lv.label for lv in plan.levels()] == list(LABELS)
    assert plan.stats.threshold_at("b1") == 0.02
    assert load_config(CONFIG, "mla_decode")["BLOCK_H"] == BASE_CONFIG["BLOCK_H"]
    assert tuple(BASE_PLAN["baseline"]) == PARAMS


@settings_for(180)
@given(data=st.data())
def test_plan_wrong_types(data):
    path = data.draw(st.sampled_from(ALL_PATHS), label="path")
    plan = copy.deepcopy(BASE_PLAN)
    set_at(plan, path, data.draw(wrong_type_for(get_at(plan, path)), label="value"))
    expect_rejected("run", dump_plan(plan), "plan: wrong type", field_needles(path))


@settings_for(70)
@given(data=st.data())
def test_plan_missing_fields(data):
    path = data.draw(st.sampled_from(REQUIRED), label="required")
    extra = data.draw(st.lists(st.sampled_from(OPTIONAL), unique=True, max_size=5), label="also deleted")
    plan = copy.deepcopy(BASE_PLAN)
    for p in extra:  # optional deletions that do not touch the required field
        if p[0] != path[0]:
            try:
                del_at(plan, p)
            except (KeyError, IndexError):  # already gone with its parent
                pass
    del_at(plan, path)
    expect_rejected("run", dump_plan(plan), "plan: missing field", field_needles(path), strict=True)


@settings_for(80)
@given(data=st.data())
def test_plan_unknown_keys(data):
    path = data.draw(st.sampled_from(MAPPING_PATHS), label="mapping")
    plan = copy.deepcopy(BASE_PLAN)
    target = get_at(plan, path)
    key = data.draw(keys, label="key")
    if key in target:
        reject()
    target[key] = data.draw(any_value, label="value")
    expect_rejected("run", dump_plan(plan), "plan: unknown key", field_needles(path))


@settings_for(70)
@given(data=st.data())
def test_plan_huge_numbers(data):
    path = data.draw(st.one_of(st.sampled_from(NUMERIC_PATHS), st.sampled_from(ALL_PATHS)), label="path")
    value = data.draw(st.one_of(st.sampled_from(HUGE), st.integers(min_value=10**12), st.integers(max_value=-1)))
    plan = copy.deepcopy(BASE_PLAN)
    set_at(plan, path, value)
    expect_rejected("run", dump_plan(plan), "plan: huge number", field_needles(path))


@settings_for(80)
@given(data=st.data())
def test_plan_unicode(data):
    plan = copy.deepcopy(BASE_PLAN)
    if data.draw(st.integers(0, 3)):  # weird text in a field with a grammar
        path = data.draw(st.sampled_from(CONSTRAINED_STRINGS), label="path")
        old = str(get_at(plan, path))
        how = data.draw(st.sampled_from(["replace", "prefix", "suffix", "insert"]))
        weird = data.draw(unicode_text, label="text")
        mid = len(old) // 2
        value = {"replace": weird, "prefix": weird + old, "suffix": old + weird,
                 "insert": old[:mid] + weird + old[mid:]}[how]  # fmt: skip
    else:  # too much unicode in a length-limited text field
        path = data.draw(st.sampled_from(sorted(LIMITED_STRINGS)), label="path")
        unit = data.draw(unicode_text.filter(bool), label="unit")
        value = (unit * (LIMITED_STRINGS[path] // len(unit) + 2))[
            : LIMITED_STRINGS[path] + 1 + data.draw(st.integers(0, 50))
        ]
    set_at(plan, path, value)
    expect_rejected("run", dump_plan(plan), "plan: unicode", field_needles(path))


TRAVERSAL = [
    "../../etc/passwd", "/etc/passwd", "plans/../../x", "kernels/../../../x", "..\\..\\x", "~/.ssh/id_rsa",
    "plans/..", "kernels/../agent/cli.py", "/work/main/plans/x.diff", "./../x", "plans/./../../x",
    "file:///etc/passwd", "plans\\..\\..\\x", "", ".", "..", "plans/x/../../..", "//etc/passwd", "plans/\x00/x",
    "$HOME/x", "%2e%2e/%2e%2e/etc/passwd", "kernels/configs/../../../../etc/shadow", "state/kinv.db",
    "agent/cli.py", "tests/x.diff", "C:\\Windows\\x", "\\\\server\\share\\x", "plans/../kernels/../../x",
    "/plans/x.diff", "~root/x", "kernels/..\\..\\x", "..", "plans/\u2025/x", "\u2024\u2024/x",
]  # fmt: skip
segments = st.lists(st.sampled_from(["..", ".", "plans", "kernels", "etc", "passwd", "~", "x.diff", "", "\u00e9"]),
                    min_size=1, max_size=6)  # fmt: skip
traversal = st.one_of(
    st.sampled_from(TRAVERSAL),
    st.builds(lambda lead, segs: lead + "/".join(segs), st.sampled_from(["", "/", "./", "../", "plans/../"]), segments)
    .filter(lambda s: s.startswith(("/", "..")) or "/../" in s or s.endswith("/..") or "/" not in s.strip("/")
            or not s.startswith(("plans/", "kernels/"))),
)  # fmt: skip


@settings_for(80)
@given(i=st.integers(0, N_VARIANTS - 1), p=traversal)
def test_plan_path_traversal_in_source_patch(i, p):
    plan = copy.deepcopy(BASE_PLAN)
    plan["variants"][i]["source_patch"] = p
    expect_rejected("run", dump_plan(plan), "plan: path traversal", ("source_patch",), strict=True)


# --------------------------------------------------------------------------- #
# the adapter-owned plan surface: workload.model, level thresholds, removed keys, kernel refs
# --------------------------------------------------------------------------- #
BAD_MODEL = {
    "heads": [0, -1, -64, 1025, 10**6, 10**30, "64", "sixty-four", 64.0, True, None, [64], {"n": 64}, 63, 65, 2, 1],
    "attention_tp": [0, -4, 65, 10**9, "4", 4.0, False, None, [4], 3, 5, 6, 7, 128],
    "shape": ["v5", "V3", "v4flash ", " v3", "", "v4", "deepseek", 3, None, ["v3"], {"v3": 1}, "v4fla\u0455h",
              "v\uff13", "v3\u200b"],
}  # fmt: skip
NOT_A_MODEL = ["v4flash", 64, [64, 4], None, True, "", 4.0, ["heads", 64]]
MODEL_EXTRA = ["heads_per_gpu", "local_heads", "block_h", "BLOCK_H", "d_qk", "Heads", "heads ", "tp", "layers"]


@settings_for(60)
@given(data=st.data())
def test_plan_bad_workload_model(data):
    """workload.model is the MLA adapter's: heads, attention_tp (heads a multiple of it) and shape."""
    plan = copy.deepcopy(BASE_PLAN)
    model = plan["workload"]["model"]
    kind = data.draw(st.sampled_from(["field", "field", "field", "extra", "not-a-mapping"]), label="kind")
    if kind == "field":
        key = data.draw(st.sampled_from(sorted(BAD_MODEL)), label="field")
        model[key] = data.draw(st.sampled_from(BAD_MODEL[key]), label="value")
    elif kind == "extra":
        model[data.draw(st.sampled_from(MODEL_EXTRA), label="key")] = data.draw(any_value, label="value")
    else:
        plan["workload"]["model"] = data.draw(st.sampled_from(NOT_A_MODEL), label="model")
    expect_rejected("run", dump_plan(plan), "plan: bad workload.model", ("workload.model",), strict=True)


not_a_label = st.one_of(
    st.sampled_from(["b2", "b0", "b-1", "B1", "b01", "b1.0", "b 1", "b1 ", " b1", "1", "8", "b", "", "batch1",
                     "ctx4096", "v4flash/h16/p64/ctx4096/b1", "b\u0661", "b\uff11", "b1\u200b", "c1", "b128",
                     "b4096", "threshold", "default", "*", "all"]),
    st.text(max_size=12),
).filter(lambda k: k not in LABELS)  # fmt: skip
bad_threshold = st.sampled_from([0, 0.0, -0.01, -1, 0.51, 1, 1.0, 2, 100, 1e308, float("nan"), float("inf"),
                                 float("-inf"), "0.02", "2%", True, False, None, [0.02], {"b1": 0.02}])  # fmt: skip


@settings_for(60)
@given(data=st.data())
def test_plan_bad_level_thresholds(data):
    """stats.level_thresholds is keyed by the workload's level labels (b1, b8, ...): any other key, or a
    threshold outside (0, 0.5], is refused."""
    plan = copy.deepcopy(BASE_PLAN)
    lt = plan["stats"]["level_thresholds"]
    if data.draw(st.booleans(), label="bad key"):
        if data.draw(st.booleans(), label="drop b1"):
            lt.clear()
        key = data.draw(not_a_label, label="key")
        lt[key] = data.draw(st.floats(0.001, 0.5), label="threshold")
        needles = (repr(key),) if key.isascii() and key.isprintable() else ()
    else:
        lt[data.draw(st.sampled_from(LABELS), label="label")] = data.draw(bad_threshold, label="threshold")
        needles = ()
    line = expect_rejected("run", dump_plan(plan), "plan: bad stats.level_thresholds", ("stats.level_thresholds",))
    assert all(n in line for n in needles), line


REMOVED = [
    (("stats", "min_threshold"), 0.01), (("stats", "noise_multiple"), 3.0), (("stats", "min_threshold"), 0.02),
    (("model",), {"heads": 64, "attention_tp": 4, "shape": "v4flash"}), (("workload", "shape"), "v4flash"),
    (("workload", "heads"), 64), (("workload", "attention_tp"), 4), (("workload", "contexts"), [4096]),
    (("workload", "shapes"), ["v4flash"]), (("workload", "batches"), [1, 8]), (("stats", "aa_workers"), 4),
]  # fmt: skip


@settings_for(30)
@given(data=st.data())
def test_plan_removed_keys(data):
    """Keys of the old schema (min_threshold, noise_multiple, top-level model: ...) are unknown keys now,
    alone or in an old-layout plan (model: at the top, none in the workload)."""
    (path, value) = data.draw(st.sampled_from(REMOVED), label="removed")
    plan = copy.deepcopy(BASE_PLAN)
    set_at(plan, path, value)
    if path == ("model",) and data.draw(st.booleans(), label="old layout"):
        del plan["workload"]["model"]
    if data.draw(st.booleans(), label="no new stats keys"):
        plan["stats"].pop("threshold")
        plan["stats"].pop("level_thresholds")
    line = expect_rejected("run", dump_plan(plan), "plan: removed key", ("unknown key",))
    assert ".".join(path) + ": unknown key" in line, line


ident = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
BAD_KERNELS = [
    "no.such.module:Cls", "kinv.kernels.mla_decode_adapter:NoSuch", "kinv.kernels.mla_decode_adapter:SPEC",
    "kinv.kernels.adapter:Level", "kinv.kernels.adapter:KernelAdapter", "kinv.kernels.launch_config:TunableSpec",
    "kinv.kernels.launch_config:brief_repr", "kinv.kernels:mla_decode", "mla_decode:", ":Cls", "kinv.kernels.mla_decode_adapter",
    "MLA_DECODE", "mla-decode", "mla_decode ", "kernels/mla_decode.py", "kernels..x:C", "x:y:z", "mla decode",
    "kinv_bad_plugin_syntax:Adapter", "kinv_bad_plugin_raises:Adapter", "kinv_bad_plugin_init:Adapter",
    "kinv_bad_plugin_name:Adapter", "kinv_bad_plugin_notype:Adapter",
]  # fmt: skip
PLUGINS = {  # adapters of a user's package that fail in each way a plugin can
    "kinv_bad_plugin_syntax": "def broken(:\n",
    "kinv_bad_plugin_raises": "raise RuntimeError('the plugin cannot load\\nsecond line')\n",
    "kinv_bad_plugin_init": ("from kinv.kernels.mla_decode_adapter import MLADecodeAdapter\n\n\n"
                             "class Adapter(MLADecodeAdapter):\n    def __init__(self):\n"
                             "        raise RuntimeError('no driver\\nsecond line')\n"),
    "kinv_bad_plugin_name": ("from kinv.kernels.mla_decode_adapter import MLADecodeAdapter\n\n\n"
                             "class Adapter(MLADecodeAdapter):\n    name = 'bad name!'\n"),
    "kinv_bad_plugin_notype": "Adapter = 42\n",
}  # fmt: skip


@pytest.fixture(scope="module")
def plugins():
    d = Path(tempfile.mkdtemp(prefix="kinv-bad-plugins-"))
    for mod, text in PLUGINS.items():
        (d / f"{mod}.py").write_text(text)
    sys.path.insert(0, str(d))
    try:
        yield d
    finally:
        sys.path.remove(str(d))
        for mod in PLUGINS:
            sys.modules.pop(mod, None)
        shutil.rmtree(d, ignore_errors=True)


@settings_for(50)
@given(data=st.data())
def test_plan_bad_kernel(plugins, data):
    """kernel: a registered name or package.module:Class of a KernelAdapter subclass; anything else, and a
    plugin that fails to import or to instantiate, is refused on the kernel field, naming it."""
    from kinv.kernels.adapter import registered

    kernel = data.draw(st.one_of(
        st.sampled_from(BAD_KERNELS),
        st.builds(lambda parts, cls: "kinv_no_such_" + ".".join(parts) + ":" + cls.title(),
                  st.lists(ident, min_size=1, max_size=3), ident),
        ident.filter(lambda n: n not in registered()),
    ), label="kernel")  # fmt: skip
    plan = copy.deepcopy(BASE_PLAN)
    plan["kernel"] = kernel
    line = expect_rejected("run", dump_plan(plan), "plan: bad kernel", ("kernel: ",))
    assert repr(kernel) in line or kernel in line, line


# --------------------------------------------------------------------------- #
# command-line arguments: kinv bench / noise / run
# --------------------------------------------------------------------------- #
def expect_cli_rejected(argv: list[str], category: str, all_needles=(), needles=()) -> str:
    with scratch() as d:
        argv = [a.replace("{tmp}", str(d)) for a in argv]
        state = d / "state"
        line = refused_cleanly(argv + ["--state-dir", str(state)], state, f"[{category}]", needles,
                               all_needles=[n.replace("{tmp}", str(d)) for n in all_needles])  # fmt: skip
    COUNTS[category] += 1
    if COUNTS[category] % 25 == 1:
        SAMPLES.setdefault(category, []).append(line)
    return line


def _parses_valid(value: str, name: str) -> bool:
    try:
        return int(value) in MLA.spec.tunable(name).values
    except ValueError:
        return False


not_a_tunable = st.one_of(
    st.sampled_from(["NOT_A_TUNABLE", "block_t", "BLOCK_t", "Block_T", "warps", "num_warp", "num_warps_", "stages",
                     "kernel", "overrides", "description", "batch_min", "batch_max", "BLOCK_\u0422", "num_warps\u200b",
                     "BLOCK_N", "BLOCK_K", "GROUP_M", "TARGET_CTAS", "", "w", "BT", "x" * 2000]),
    ident, st.text(max_size=10),
).filter(lambda k: k.strip() not in PARAMS and "," not in k and "=" not in k)  # fmt: skip


def bad_value_for(name: str):
    return st.one_of(
        st.sampled_from(["3", "0", "-4", "-1", "7", "24", "32", "512", "1024", "99999999999999999999", "", "abc",
                         "8.0", "0x8", "1e1", "eight", "8 8", "\u221e", "None", "true", "[8]", "8;", "2**3"]),
        st.integers(-(10**6), 10**6).map(str), st.text(max_size=6),
    ).filter(lambda v: "," not in v and not _parses_valid(v, name))  # fmt: skip


@settings_for(80)
@given(data=st.data())
def test_cli_bench_bad_variant(data):
    """``kinv bench --variant K=V[,K=V]``: K must be one of the kernel's tunables (the line names them all),
    V an integer it allows; refused before anything is stored."""
    kind = data.draw(st.sampled_from(["not a tunable", "not a tunable", "bad value", "no =", "after a good one"]))
    good = data.draw(st.sampled_from(PARAMS), label="tunable")
    if kind == "not a tunable":
        key = data.draw(not_a_tunable, label="key")
        variant = f"{key}={data.draw(st.sampled_from(['3', '8', '1', 'x']), label='value')}"
        needles = PARAMS + ("--variant",)
    elif kind == "bad value":
        variant = f"{good}={data.draw(bad_value_for(good), label='value')}"
        needles = ("--variant", good)
    elif kind == "no =":
        variant = data.draw(st.sampled_from([good, good + ":8", good + " 8", good + "==8"]), label="variant")
        needles = ("--variant", good)
    else:
        variant = "num_warps=8," + data.draw(st.sampled_from(["NOT_A_TUNABLE=3", "", "num_stages=0", "BLOCK_T=24",
                                                             "num_warps", "x=1"]), label="second")  # fmt: skip
        needles = ("--variant",)
    as_json = ["--json"] if data.draw(st.booleans(), label="--json") else []
    expect_cli_rejected(["bench", "--plan", str(PLAN), "--backend", "replay", f"--variant={variant}", *as_json],
                        f"cli: bench --variant ({kind})", all_needles=needles)  # fmt: skip


def test_cli_bench_variant_not_a_tunable(monkeypatch):
    """As a person types it (the default --plan, plans/3a-attention-occupancy.yaml, from the repo root)."""
    monkeypatch.chdir(ROOT)
    line = expect_cli_rejected(["bench", "--variant", "NOT_A_TUNABLE=3", "--backend", "replay"],
                               "cli: bench --variant (not a tunable)", all_needles=("NOT_A_TUNABLE",) + PARAMS)  # fmt: skip
    assert "mla_decode" in line, line


BAD_PLAN_PATHS = {  # name -> (file text or None for missing, "dir" for a directory), needle
    "missing.yaml": (None, "does not exist"),
    "no/such/dir/plan.yaml": (None, "does not exist"),
    "a-directory": ("dir", "directory"),
    "old-layout.yaml": (dump_plan({**{k: v for k, v in BASE_PLAN.items() if k != "workload"},
                                   "model": BASE_PLAN["workload"]["model"],
                                   "workload": {k: v for k, v in BASE_PLAN["workload"].items() if k != "model"}}),
                        "model: unknown key"),
    "min-threshold.yaml": (dump_plan({**BASE_PLAN, "stats": {"min_threshold": 0.01}}), "stats.min_threshold"),
    "bad-kernel.yaml": (dump_plan({**BASE_PLAN, "kernel": "no.such.module:Cls"}), "no.such.module"),
    "empty.yaml": ("", "mapping"),
    "binary.yaml": (b"\x89PNG\r\n\x1a\n\xff\x00", "UTF-8"),
}  # fmt: skip


@settings_for(40)
@given(name=st.sampled_from(sorted(BAD_PLAN_PATHS)),
       cmd=st.sampled_from(["bench", "bench --json", "bench --variant num_warps=8", "bench --config", "noise",
                            "noise --json", "run", "env"]))  # fmt: skip
def test_cli_bad_plan_path(name, cmd):
    """``--plan`` of bench and noise (and run's argument): a missing file, a directory, a bad plan."""
    content, needle = BAD_PLAN_PATHS[name]
    with scratch() as d:
        path = d / name
        if content == "dir":
            path.mkdir()
        elif content is not None:
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
        if cmd == "run":
            argv = ["run", str(path), "--backend", "replay", "--approval", "auto"]
        elif cmd == "env":
            argv = ["env", "--plan", str(path)]
        else:
            argv = [*cmd.split()[:1], "--plan", str(path), "--backend", "replay", *cmd.split()[1:]]
            if cmd == "bench --config":
                argv[-1:] = ["--config", str(CONFIG)]
        state = d / "state"
        line = refused_cleanly(argv + ["--state-dir", str(state)], state, f"[cli: --plan {name}]", (needle,),
                               names=str(path))  # fmt: skip
    COUNTS["cli: --plan"] += 1
    if COUNTS["cli: --plan"] % 25 == 1:
        SAMPLES.setdefault("cli: --plan", []).append(line)


def out_of_range(lo: int, hi: int):
    return st.one_of(st.integers(max_value=lo - 1), st.integers(min_value=hi + 1), st.sampled_from(
        ["abc", "1.5", "", " ", "ten", "0x10", "1e3", "--", "None", "[8]"])).map(str)  # fmt: skip


BAD_OPTIONS = {  # argv template -> (strategy of the bad value, needle); {v} is the value
    "bench --samples={v}": (out_of_range(1, 1000), "--samples"),
    "bench --rounds={v}": (out_of_range(2, 1000), "--rounds"),
    "noise --rounds={v}": (out_of_range(3, 1000), "--rounds"),
    "noise --workers={v}": (out_of_range(2, 8), "--workers"),
    "bench --backend={v}": (st.sampled_from(["nope", "gpu", "CUDA", "Replay", "replay ", "", "h200", "cpu"]), "--backend"),
    "noise --backend={v}": (st.sampled_from(["nope", "gpu", "CUDA", "Replay", "", "triton"]), "--backend"),
    "run PLAN --backend={v}": (st.sampled_from(["nope", "gpu", "CUDA", ""]), "--backend"),
    "run PLAN --approval={v}": (st.sampled_from(["yes", "never", "AUTO", "", "auto-everything"]), "--approval"),
    "bench --levels={v}": (st.sampled_from(["1,8", "1", "x"]), "--levels"),  # removed options
    "bench --contexts={v}": (st.sampled_from(["4096", "x"]), "--contexts"),
    "bench --shapes={v}": (st.sampled_from(["v3", "v4flash"]), "--shapes"),
    "noise --levels={v}": (st.sampled_from(["1,8", "96"]), "--levels"),
    "noise --shapes={v}": (st.sampled_from(["v3"]), "--shapes"),
    "bench --config={v}": (st.sampled_from(["{tmp}/missing.json", "{tmp}", "{tmp}/no/such.json"]), "{tmp}"),
    "kernels --bogus={v}": (st.sampled_from(["1", "x"]), "--bogus"),
}  # fmt: skip


@settings_for(90)
@given(data=st.data())
def test_cli_bad_options(data):
    """Options of bench, noise and run: out of range, unknown values, removed options (--levels,
    --contexts, --shapes), a missing --config."""
    template = data.draw(st.sampled_from(sorted(BAD_OPTIONS)), label="template")
    values, needle = BAD_OPTIONS[template]
    v = data.draw(values, label="value")
    argv = [a.replace("{v}", v).replace("PLAN", str(PLAN)) for a in template.split(" ")]
    if argv[0] in ("bench", "noise") and "--backend" not in template:
        argv += ["--plan", str(PLAN), "--backend", "replay"]
    elif argv[0] == "run" and "--backend" not in template:
        argv += ["--backend", "replay"]
    expect_cli_rejected(argv, f"cli: {template.split('=')[0].replace('PLAN ', '')}", all_needles=(needle,))


# --------------------------------------------------------------------------- #
# raw plan text
# --------------------------------------------------------------------------- #
PLACEHOLDER = "__KINV_PLACEHOLDER__"
RAW_NEEDLES = ("YAML", "UTF-8", "mapping", "nests", "bytes", "unknown key") + TOP_KEYS
BOMB_SLOTS = [("hypothesis",), ("baseline",), ("environment",), ("workload", "levels"), ("workload", "model"),
              ("stats", "level_thresholds"), ("bounds", "BLOCK_T"),
              ("variants", 0, "patch", "overrides"), ("variants",), ("backlog",), ("workstream", "title"),
              ("x_bomb",)]  # fmt: skip


def with_raw(slot, raw: str) -> str:
    plan = copy.deepcopy(BASE_PLAN)
    if slot == ("x_bomb",):
        plan["x_bomb"] = PLACEHOLDER
    else:
        set_at(plan, slot, PLACEHOLDER)
    return dump_plan(plan).replace(PLACEHOLDER, raw)


def laughs(depth: int, width: int, mapping: bool) -> str:
    """Billion laughs in flow style: level k holds `width` aliases of level k-1."""
    if mapping:
        parts = ["{k0: &a0 {" + ", ".join(f"l{j}: lol" for j in range(width)) + "}"]
        parts += [
            f"k{k}: &a{k} {{" + ", ".join(f"l{j}: *a{k - 1}" for j in range(width)) + "}" for k in range(1, depth)
        ]
        return ", ".join(parts) + "}"
    parts = ["&a0 [" + ", ".join(["lol"] * width) + "]"]
    parts += [f"&a{k} [" + ", ".join([f"*a{k - 1}"] * width) + "]" for k in range(1, depth)]
    return "[" + ", ".join(parts) + "]"


bombs = st.one_of(
    st.builds(laughs, st.integers(3, 12), st.integers(2, 12), st.booleans()),
    st.builds(lambda n, m: "[&w [" + ", ".join(["lol"] * n) + "], " + ", ".join(["*w"] * m) + "]",
              st.integers(10, 2000), st.integers(10, 3000)),  # wide alias fan
    st.builds(lambda n: "&r [" + ", ".join(["*r"] * n) + "]", st.integers(1, 500)),  # self-referencing list
    st.builds(lambda n: "&r {" + ", ".join(f"k{j}: *r" for j in range(n)) + "}", st.integers(1, 300)),
    st.builds(lambda d: "[&m0 {a: 1}, " + ", ".join(f"&m{k} {{<<: [*m{k - 1}, *m{k - 1}], b{k}: {k}}}" for k in range(1, d)) + "]",
              st.integers(2, 40)),  # merge-key chain
)  # fmt: skip


@settings_for(60)
@given(slot=st.sampled_from(BOMB_SLOTS), bomb=bombs)
def test_plan_yaml_bombs(slot, bomb):
    expect_rejected("run", with_raw(slot, bomb), "plan: YAML bomb", RAW_NEEDLES, strict=True)


BROKEN = ["[", "{", "}", "]", ": :", "- - :", "'unclosed", '"unclosed', "&", "*undefined", "%YAML 9.9\n---",
          "!!python/object/apply:os.system ['echo hi']", "!!python/name:os.system", "!!binary ***", "!!int abc",
          "!!timestamp 2024-13-45", "!!float x", "\tkey: value", "---\n---", "? [a]\n: b", "!!set {a: [1]}", "@x",
          "`x", "key: value: other", "!!int 0b", "!!int " + "9" * 5000, "!!float " + "9" * 5000 + "e9999", "|\n x",
          "!<tag:yaml.org,2002:int> z", "!!str [a]", "!!map [a]", "!!seq {a: 1}", "!!omap [a]", "!!pairs {a: 1}",
          "2001-02-30", "!!timestamp 1-1-1", "!!bool maybe", "!!null x", "...\n...", "\x07", "\ufffe"]  # fmt: skip


@settings_for(60)
@given(data=st.data())
def test_plan_invalid_yaml(data):
    text = dump_plan(BASE_PLAN)
    lines = text.splitlines(keepends=True)
    kind = data.draw(st.sampled_from(["insert", "truncate", "slot"]))
    if kind == "insert":
        at = data.draw(st.integers(0, len(lines)))
        junk = data.draw(st.sampled_from(BROKEN))
        indent = data.draw(st.sampled_from(["", " ", "  ", "\t"]))
        text = "".join(lines[:at]) + indent + junk + "\n" + "".join(lines[at:])
    elif kind == "truncate":
        text = text[: data.draw(st.integers(1, len(text) - 2))]
    else:
        text = with_raw(data.draw(st.sampled_from(BOMB_SLOTS)), data.draw(st.sampled_from(BROKEN)))
    expect_rejected("run", text, "plan: invalid YAML", RAW_NEEDLES)


NOT_MAPPINGS = ["[1, 2, 3]", "- a\n- b", "42", "'a string'", "!!str plan", "true", "~", "null", "[]", "--- 1\n",
                "|\n  text", "- " + dump_plan(BASE_PLAN).replace("\n", "\n  "), "!!set {a, b}"]  # fmt: skip


@settings_for(40)
@given(text=st.one_of(
    st.sampled_from(NOT_MAPPINGS),
    st.one_of(st.lists(st.one_of(scalars, st.just(BASE_PLAN)), max_size=4), scalars).map(
        lambda v: yaml.safe_dump(v, allow_unicode=True)),
))  # fmt: skip
def test_plan_top_level_not_a_mapping(text):
    expect_rejected("run", text, "plan: top level not a mapping", ("mapping", "YAML"), strict=True)


@settings_for(50)
@given(head=st.sampled_from([b"", b"\x89PNG\r\n\x1a\n", b"\x7fELF\x02\x01", b"\xff\xfe", b"\x1f\x8b\x08", b"\xfe\xff",
                             b"PK\x03\x04", b"\x00\x00\x00", b"%PDF-1.4\n\xe2\xe3"]),
       body=st.binary(min_size=1, max_size=2000))  # fmt: skip
def test_plan_binary_garbage(head, body):
    data = head + body + (b"\xff" if head == b"" and len(body) % 2 else b"\x00")  # never a plan
    expect_rejected("run", data, "plan: binary garbage", RAW_NEEDLES, strict=True)


@settings_for(30)
@given(
    ws=st.text(alphabet=" \t\r\n", max_size=40),
    extra=st.sampled_from(["", "# only a comment", "---", "...", "~", "null", "\ufeff", "--- # c\n...", "{}", "[]"]),
)
def test_plan_empty(ws, extra):
    expect_rejected("run", ws + extra + ws, "plan: empty", RAW_NEEDLES, strict=True)


@settings_for(30)
@given(data=st.data())
def test_plan_very_long_lines(data):
    where = data.draw(st.sampled_from(["hypothesis", "title", "id", "key", "comment+key", "line"]))
    # pure-Python YAML reads ~100 KB/s: long fields stay short of the size limit, raw lines go past it
    n = data.draw(st.integers(4001, 12_000) if where in ("hypothesis", "title", "id", "key")
                  else st.one_of(st.integers(4001, 12_000), st.integers(MAX_PLAN_BYTES + 1, 2 * MAX_PLAN_BYTES)), label="length")  # fmt: skip
    unit = data.draw(st.sampled_from(["x", "\u00e9", "\U0001f525", "ab ", "lol, "]), label="unit")
    long = (unit * (n // len(unit) + 1))[:n]
    plan = copy.deepcopy(BASE_PLAN)
    if where == "hypothesis":
        plan["hypothesis"] = long
    elif where == "title":
        plan["variants"][0]["title"] = long
    elif where == "id":
        plan["variants"][1]["id"] = "V" + long
    elif where == "key":
        plan["k" + long] = 1
    text = dump_plan(plan)
    if where == "comment+key":
        text += "#" + long + "\nx: 1\n"
    elif where == "line":
        text = long + "\n" + text
    expect_rejected("run", text, "plan: very long line", RAW_NEEDLES, strict=True)


@settings_for(40)
@given(
    n=st.one_of(st.integers(60, 5000), st.sampled_from([20_000, 130_000])),
    kind=st.sampled_from(["flow-list", "flow-map", "open", "block-list", "in-field"]),
)
def test_plan_deep_nesting(n, kind):
    if kind == "flow-list":
        text = "[" * n + "]" * n
    elif kind == "flow-map":
        n = min(n, 40_000)
        text = "{a: " * n + "1" + "}" * n
    elif kind == "open":
        text = "[" * n
    elif kind == "block-list":
        n = min(n, 250)
        text = "".join("  " * i + "-\n" for i in range(n)) + "  " * n + "- x\n"
    else:
        text = with_raw(("hypothesis",), "[" * min(n, 100_000) + "]" * min(n, 100_000))
    expect_rejected("run", text, "plan: deep nesting", RAW_NEEDLES, strict=True)


@settings_for(50)
@given(data=st.data())
def test_plan_duplicate_keys(data):
    import re

    text = dump_plan(BASE_PLAN)
    lines = text.splitlines(keepends=True)
    candidates = [i for i, ln in enumerate(lines) if re.match(r"^ *[A-Za-z_]\w*: \S", ln)]
    kind = data.draw(st.sampled_from(["line", "flow", "top"]))
    if kind == "line":
        i = data.draw(st.sampled_from(candidates), label="line")
        m = re.match(r"^( *)(\w+): ", lines[i])
        value = data.draw(st.sampled_from(["same", "1", "'x'", "[]", "{}"]))
        dup = lines[i] if value == "same" else f"{m.group(1)}{m.group(2)}: {value}\n"
        at = data.draw(st.sampled_from(["before", "after"]))
        lines.insert(i + (at == "after"), dup)
        text = "".join(lines)
    elif kind == "flow":
        k = data.draw(st.sampled_from(PARAMS))
        plan = copy.deepcopy(BASE_PLAN)
        plan["baseline"] = PLACEHOLDER
        flow = (
            "{" + ", ".join(f"{p}: {BASE_PLAN['baseline'][p]}" for p in PARAMS) + f", {k}: {BASE_PLAN['baseline'][k]}}}"
        )
        text = dump_plan(plan).replace(PLACEHOLDER, flow)
    else:
        k = data.draw(st.sampled_from(TOP_KEYS))
        text = text + dump_plan({k: BASE_PLAN[k]})
    expect_rejected("run", text, "plan: duplicate keys", ("duplicate key",), strict=True)


# --------------------------------------------------------------------------- #
# config files (bench --config)
# --------------------------------------------------------------------------- #
CONFIG_KEYS = ("kernel", "description") + PARAMS
CFG_NEEDLES = PARAMS + (
    "kernel",
    "description",
    "overrides",
    "JSON",
    "unknown config key",
    "is missing",
    "UTF-8",
    "bytes",
)


def dump_config(cfg, data) -> str:
    return json.dumps(cfg, ensure_ascii=data.draw(st.booleans(), label="ascii"),
                      indent=data.draw(st.sampled_from([None, 2])))  # fmt: skip


@settings_for(60)
@given(data=st.data())
def test_config_wrong_types(data):
    cfg = copy.deepcopy(BASE_CONFIG)
    if data.draw(st.integers(0, 9)) == 0:
        cfg = data.draw(st.one_of(scalars, st.lists(scalars, max_size=3), st.just([BASE_CONFIG])), label="top")
        needles = ("config must be a JSON object", "JSON")
    else:
        key = data.draw(st.sampled_from(CONFIG_KEYS + ("overrides",)), label="key")
        old = cfg.get(key, [])
        cfg[key] = data.draw(wrong_type_for(old), label="value")
        needles = (key, "JSON")
    expect_rejected("bench", dump_config(cfg, data), "config: wrong type", needles)


@settings_for(50)
@given(data=st.data())
def test_config_unknown_keys(data):
    cfg = copy.deepcopy(BASE_CONFIG)
    key = data.draw(keys, label="key")
    if not isinstance(key, str) or key in cfg or key in ("overrides", "shape"):
        reject()
    if data.draw(st.booleans()):
        cfg[key] = data.draw(any_value, label="value")
        needles = ("unknown config key", "JSON")
    else:
        cfg["overrides"] = [{"batch_min": 9, "num_warps": 8, key: data.draw(any_value, label="value")}]
        needles = ("overrides[0]", "JSON")
    expect_rejected("bench", dump_config(cfg, data), "config: unknown key", needles)


bad_param = st.one_of(
    st.sampled_from([3, 24, 0, -1, 7, 12, 48, 512, 1024, 2**31, 10**30, True, False, 4.0, 16.0, "4", "16", 2.5]),
    st.integers(-(10**9), 10**9),
)


@settings_for(60)
@given(data=st.data())
def test_config_bad_values(data):
    cfg = copy.deepcopy(BASE_CONFIG)
    key = data.draw(st.sampled_from(PARAMS), label="key")
    cfg[key] = data.draw(bad_param, label="value")
    if key == "num_stages" and data.draw(st.booleans()):
        cfg[key] = data.draw(st.sampled_from([0, 7, 8, -2, True]))
    expect_rejected("bench", dump_config(cfg, data), "config: bad value", (key,))


@settings_for(30)
@given(data=st.data())
def test_config_missing_fields(data):
    cfg = copy.deepcopy(BASE_CONFIG)
    gone = data.draw(st.lists(st.sampled_from(PARAMS), min_size=1, max_size=4, unique=True), label="deleted")
    for k in gone + data.draw(st.lists(st.sampled_from(["kernel", "description"]), unique=True), label="also"):
        cfg.pop(k, None)
    expect_rejected("bench", dump_config(cfg, data), "config: missing field", ("is missing",), strict=True)


override_item = st.one_of(
    st.fixed_dictionaries({}, optional={
        "batch_min": st.one_of(st.integers(-3, 1 << 21), bad_param, scalars),
        "batch_max": st.one_of(st.integers(-3, 1 << 21), bad_param, scalars),
        "num_warps": st.one_of(st.sampled_from([1, 2, 4, 8, 16]), bad_param),
        "BLOCK_T": st.one_of(st.sampled_from([16, 32, 64]), bad_param),
        "num_stages": bad_param,
        "shape": st.one_of(st.sampled_from(["v2", "V3", "v3 ", "", "v4-flash", "v3,v4flash"]), scalars),
    }),
    scalars, st.lists(scalars, max_size=2),
)  # fmt: skip


@settings_for(60)
@given(data=st.data())
def test_config_overrides_mangled(data):
    cfg = copy.deepcopy(BASE_CONFIG)
    cfg["overrides"] = data.draw(st.one_of(st.lists(override_item, min_size=1, max_size=4), scalars,
                                           st.dictionaries(st.text(max_size=5), scalars, max_size=2)), label="overrides")  # fmt: skip
    expect_rejected("bench", dump_config(cfg, data), "config: overrides mangled", ("overrides", "JSON"))


BROKEN_JSON = ["{", "}", "[", ",", "//", "/* c */", "'", '"', "NaN", "Infinity", "-Infinity", "undefined", "\\",
               "\x00", "{}{}", ":", "True", "None", "0x10", "+1", "01", ".5", "1.", "\ufeff", "\u00a0"]  # fmt: skip


@settings_for(50)
@given(data=st.data())
def test_config_invalid_json(data):
    text = json.dumps(BASE_CONFIG, indent=data.draw(st.sampled_from([None, 2])))
    kind = data.draw(st.sampled_from(["truncate", "insert", "replace-value", "trailing-comma", "single-quotes"]))
    if kind == "truncate":
        text = text[: data.draw(st.integers(0, len(text) - 1))]
    elif kind == "insert":
        at = data.draw(st.integers(0, len(text)))
        text = text[:at] + data.draw(st.sampled_from(BROKEN_JSON)) + text[at:]
    elif kind == "replace-value":
        text = text.replace(
            "4", data.draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "04", "4.", "0x4", "'4'"])), 1
        )
    elif kind == "trailing-comma":
        text = text.rstrip().rstrip("}") + ",}"
    else:
        text = text.replace('"', "'")
    expect_rejected("bench", text, "config: invalid JSON", CFG_NEEDLES)


@settings_for(25)
@given(data=st.data())
def test_config_huge(data):
    kind = data.draw(st.sampled_from(["big-file", "big-int", "big-float", "deep", "long-key", "wide"]))
    cfg = copy.deepcopy(BASE_CONFIG)
    if kind == "big-file":
        cfg["description"] = "x" * data.draw(st.integers(256 * 1024, 600 * 1024))
        text = json.dumps(cfg)
    elif kind == "big-int":
        text = json.dumps(cfg).replace('"num_warps": 4', '"num_warps": ' + "9" * data.draw(st.integers(20, 100_000)))
    elif kind == "big-float":
        text = json.dumps(cfg).replace('"BLOCK_T": 16', '"BLOCK_T": 1e' + str(data.draw(st.integers(308, 10**6))))
    elif kind == "deep":
        n = data.draw(st.integers(100, 200_000))
        text = json.dumps(cfg).replace('"num_stages": 2', '"num_stages": ' + "[" * n + "]" * n)
    elif kind == "long-key":
        cfg["k" * data.draw(st.integers(1000, 200_000))] = 1
        text = json.dumps(cfg)
    else:
        cfg["overrides"] = [
            {"batch_min": i + 1, "batch_max": i + 1, "num_warps": 3} for i in range(data.draw(st.integers(100, 5000)))
        ]
        text = json.dumps(cfg)
    expect_rejected("bench", text, "config: huge", CFG_NEEDLES, strict=True)


@settings_for(40)
@given(data=st.data())
def test_config_unicode(data):
    cfg = copy.deepcopy(BASE_CONFIG)
    kind = data.draw(st.sampled_from(["kernel", "key", "value", "encoding"]))
    weird = data.draw(unicode_text.filter(bool), label="text")
    if kind == "kernel":
        how = data.draw(st.sampled_from(["prefix", "suffix", "replace"]))
        cfg["kernel"] = {"prefix": weird + cfg["kernel"], "suffix": cfg["kernel"] + weird, "replace": weird}[how]
    elif kind == "key":
        k = data.draw(st.sampled_from(PARAMS))
        cfg[k[: len(k) // 2] + weird + k[len(k) // 2 :]] = cfg.pop(k)
    elif kind == "value":
        cfg[data.draw(st.sampled_from(PARAMS))] = str(cfg["BLOCK_T"]) + weird
    else:  # valid content, but not UTF-8
        cfg["description"] = "caf\u00e9 " + weird
        enc = data.draw(st.sampled_from(["utf-16", "utf-32", "latin-1", "cp1252", "utf-16-be"]))
        try:
            raw = json.dumps(cfg, ensure_ascii=False).encode(enc)
        except UnicodeError:  # the text has characters latin-1 cannot say
            raw = json.dumps(cfg, ensure_ascii=False).encode(enc, errors="replace")
        expect_rejected("bench", raw, "config: unicode", ("UTF-8", "JSON"), strict=True)
        return
    expect_rejected("bench", dump_config(cfg, data), "config: unicode", CFG_NEEDLES)


@settings_for(20)
@given(data=st.data())
def test_config_duplicate_keys(data):
    k = data.draw(st.sampled_from(CONFIG_KEYS), label="key")
    v = json.dumps(data.draw(st.sampled_from([BASE_CONFIG.get(k), 8, "x", None])))
    body = json.dumps(BASE_CONFIG)[1:-1]
    text = "{" + (f'"{k}": {v}, ' + body if data.draw(st.booleans()) else body + f', "{k}": {v}') + "}"
    if data.draw(st.booleans()):
        text = json.dumps(dict(BASE_CONFIG, overrides=[{"batch_min": 9, "num_warps": 8}]))
        text = text.replace('"batch_min": 9', '"batch_min": 9, "batch_min": 9')
    expect_rejected("bench", text, "config: duplicate keys", ("duplicate key",), strict=True)


# --------------------------------------------------------------------------- #
# refused before anything is created: pids, recordings, backends, live configs, ids, state dirs
# --------------------------------------------------------------------------- #
RECORDED_BATCHES = tuple(BASE_PLAN["workload"]["levels"])
SHIPPED_CONFIG = CONFIG.read_bytes()


def refused_in_box(argv: list[str], category: str, box: Path, env: dict | None = None, needles=(),
                   all_needles=(), code: int = 2) -> str:  # fmt: skip
    """Run the CLI in ``box`` (its working directory) under ``env`` (None: unset) and check the contract:
    exit ``code``, one printable ``kinv: `` line naming every one of ``all_needles`` (and one of
    ``needles``), no traceback, the box's listing (state dir, files, the live config in box/configs)
    byte-identical, and the module's live config untouched."""
    env = {"KINV_STATE_DIR": str(box / "state"), "KINV_CONFIG_DIR": str(box / "configs"), **(env or {})}
    saved = {k: os.environ.get(k) for k in env}
    cwd = os.getcwd()
    before = listing(box)
    try:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        os.chdir(box)
        rc, out, err = call_cli(argv)
    finally:
        os.chdir(cwd)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    what = (f"[{category}] argv={[a[:120] for a in argv]!r} env={ {k: (v or '')[:80] for k, v in env.items()} }\n"
            f"rc={rc!r}\nstderr={err[:1000]!r}\nstdout={out[-500:]!r}")  # fmt: skip
    assert "Traceback" not in out + err, what
    assert rc == code, what
    lines = err.splitlines()
    assert len(lines) == 1 and err.count("\n") == 1, what
    line = lines[0]
    assert line.startswith("kinv: ") and 20 < len(line) <= 800 and line.isprintable(), what
    if needles:
        assert any(n in line for n in needles), f"message names none of {needles}: {what}"
    missing = [n for n in all_needles if n not in line]
    assert not missing, f"message does not name {missing}: {what}"
    assert listing(box) == before, f"a refused command created or changed a file: {what}"
    assert LIVE["path"].read_bytes() == LIVE["bytes"], f"live config changed: {what}"
    COUNTS[category] += 1
    if COUNTS[category] % 25 == 1:
        SAMPLES.setdefault(category, []).append(line.replace(str(box), "BOX"))
    return line


@contextmanager
def box_dir(live: bytes | None = None, with_state: bool = False):
    """A scratch working directory: plans/ (a link to the repo's), configs/mla_decode.json (``live``, default
    the seed's), and with ``with_state`` a state dir holding workstream #3a (checkpointed: nothing to flush)."""
    with scratch() as d:
        (d / "configs").mkdir()
        (d / "configs" / "mla_decode.json").write_bytes(SEED_MLA_CONFIG.encode() if live is None else live)
        (d / "plans").symlink_to(ROOT / "plans")
        if with_state:
            shutil.copytree(STATE_TEMPLATE(), d / "state")
        yield d


_STATE: dict = {}


def STATE_TEMPLATE() -> Path:  # noqa: N802 - a module constant, made on first use
    if "dir" not in _STATE:
        from kinv.agent.store import Store

        d = Path(tempfile.mkdtemp(prefix="kinv-bad-state-")) / "state"
        atexit.register(shutil.rmtree, d.parent, True)  # the template outlives each test, not the run
        s = Store(d)
        s.upsert_workstream({"id": "#3a", "title": "t", "kernel": "mla_decode", "plan_path": str(PLAN), "status": "open"})
        s.conn.close()
        _STATE["dir"] = d
    return _STATE["dir"]


bad_pid = st.one_of(st.integers(max_value=0), st.integers(min_value=4_194_305, max_value=10**30),
                    st.sampled_from([0, -1, 999_999_999, 12345678901234567890123]))  # fmt: skip


@settings_for(40)
@given(pid=bad_pid, as_json=st.booleans())
def test_env_bad_pid_creates_nothing(pid, as_json):
    """``kinv env --pid``: no such process, or no valid pid at all; refused before the state dir exists."""
    with box_dir() as d:
        refused_in_box(["env", "--pid", str(pid), "--plan", str(PLAN), *(["--json"] if as_json else [])],
                       "cli: env --pid", d, all_needles=(str(pid)[:20],))  # fmt: skip


unrecorded_batch = st.integers(1, 4096).filter(lambda b: b not in RECORDED_BATCHES)
unrecorded_ctas = st.integers(1, 1 << 20).filter(lambda c: c != 512).map(str)


@settings_for(60)
@given(data=st.data())
def test_replay_cannot_serve_creates_nothing(data):
    """run, bench and noise on replay with a level or a TARGET_CTAS value no recording holds, or a variant
    whose pair was never recorded: refused before the state dir exists."""
    kind = data.draw(st.sampled_from(["level", "target_ctas", "variant"]), label="kind")
    cmd = data.draw(st.sampled_from(["run", "bench", "noise", "bench --variant"]), label="cmd")
    plan = copy.deepcopy(BASE_PLAN)
    variant, needles = "num_warps=8", ()
    if kind == "level":
        b = data.draw(unrecorded_batch, label="batch")
        plan["workload"]["levels"] = sorted({*data.draw(st.lists(st.sampled_from(RECORDED_BATCHES), max_size=3)), b})
        needles = (f"b{b}",)
    elif kind == "target_ctas":
        ctas = data.draw(unrecorded_ctas, label="TARGET_CTAS")
        plan["environment"]["TARGET_CTAS"] = ctas
        needles = ("TARGET_CTAS", ctas)
    else:
        cmd = "bench --variant"
        variant = data.draw(st.sampled_from(["num_warps=1", "num_warps=2", "num_warps=16", "BLOCK_T=256",
                                             "num_stages=6", "BLOCK_T=256,num_stages=5", "num_stages=4"]), label="variant")  # fmt: skip
        needles = ("replay has no",)
    with box_dir() as d:
        f = d / "plan.yaml"
        f.write_text(dump_plan(plan))
        if cmd == "run":
            argv = ["run", str(f), "--backend", "replay", "--approval", "auto"]
        else:
            argv = [cmd.split()[0], "--plan", str(f), "--backend", "replay"]
            argv += ["--variant", variant] if cmd == "bench --variant" else []
        argv += ["--json"] if cmd != "run" and data.draw(st.booleans(), label="--json") else []
        refused_in_box(argv, f"cli: replay cannot serve ({kind})", d, all_needles=needles)


@settings_for(16)
@given(cmd=st.sampled_from(["run", "bench", "noise", "bench --variant num_warps=8", "campaign"]), as_json=st.booleans())
def test_cuda_without_a_gpu_creates_nothing(cmd, as_json):
    with box_dir() as d:
        if cmd == "run":
            argv = ["run", str(PLAN), "--backend", "cuda", "--approval", "auto"]
        elif cmd == "campaign":
            argv = ["campaign", str(ROOT / "plans" / "7-decode-ceiling.yaml"), "--backend", "cuda"]
        else:
            argv = [*cmd.split()[:1], "--plan", str(PLAN), "--backend", "cuda", *cmd.split()[1:]]
        argv += ["--json"] if as_json and cmd != "run" else []
        refused_in_box(argv, "cli: --backend cuda without a GPU", d, all_needles=("no CUDA GPU",))


bad_live = st.one_of(
    st.sampled_from([b"garbage\n", b"", b"{", b"[]", b"null", b"\xff\xfe", b'{"kernel": "mla_decode"}']),
    st.builds(lambda k, v: json.dumps({**BASE_CONFIG, k: v}).encode(), st.sampled_from(PARAMS),
              st.sampled_from([7, 3, 0, -1, 24, "8", None, 8.0, 10**30])),
)  # fmt: skip


@settings_for(40)
@given(live=bad_live, cmd=st.sampled_from(["run", "bench", "noise"]))
def test_bad_live_config_creates_nothing(live, cmd):
    """A first run, bench or noise whose live config file is not a valid config: refused, nothing created,
    the file left exactly as it was."""
    with box_dir(live) as d:
        argv = (["run", str(PLAN), "--backend", "replay", "--approval", "auto"] if cmd == "run" else
                [cmd, "--plan", str(PLAN), "--backend", "replay"])  # fmt: skip
        refused_in_box(argv, "cli: bad live config", d, all_needles=("mla_decode.json",))


# ---- plans refused at load time --------------------------------------------------
title_fields = [("workstream", "title"), ("workstream", "parent_title"), ("variants", 0, "title"),
                ("variants", 1, "title"), ("backlog", 0, "title")]  # fmt: skip
control_char = st.one_of(st.characters(min_codepoint=0, max_codepoint=31), st.just("\x7f"),
                         st.characters(min_codepoint=0x80, max_codepoint=0x9f),
                         st.sampled_from(["\u202e", "\u202d", "\u2066", "\u2069", "\u200f", "\u2028", "\u2029"]))  # fmt: skip


@settings_for(80)
@given(data=st.data())
def test_plan_control_characters_in_titles(data):
    """A NUL, an escape sequence, a bell, a line break or a bidi override in a title; control characters
    (other than line breaks and tabs) in the prose fields: refused at load time, naming the field."""
    plan = copy.deepcopy(BASE_PLAN)
    prose = data.draw(st.booleans(), label="prose")
    if prose:
        path = data.draw(st.sampled_from([("hypothesis",), ("variants", 0, "rationale"), ("backlog", 1, "rationale")]))
        ch = data.draw(control_char.filter(lambda c: c not in "\n\t"), label="char")
    else:
        path = data.draw(st.sampled_from(title_fields), label="field")
        ch = data.draw(control_char, label="char")
    old = get_at(plan, path) or "a title"
    at = data.draw(st.integers(0, len(old)), label="at")
    set_at(plan, path, old[:at] + ch * data.draw(st.integers(1, 3)) + old[at:])
    with box_dir() as d:
        f = d / "plan.yaml"
        f.write_text(dump_plan(plan))
        with pytest.raises(ValueError):
            load_plan(f)
        refused_in_box(["run", str(f), "--backend", "replay", "--approval", "auto"], "plan: control characters", d,
                       all_needles=(str(path[-1]), "control character"))  # fmt: skip


@settings_for(60)
@given(data=st.data())
def test_plan_source_patch_missing_or_not_a_diff(data):
    """A variant's source_patch that does not exist, or is not a unified diff: refused at load time."""
    plan = copy.deepcopy(BASE_PLAN)
    i = data.draw(st.integers(0, len(plan["variants"]) - 1), label="variant")
    kind = data.draw(st.sampled_from(["missing", "text", "empty", "binary", "half-diff"]), label="kind")
    name = data.draw(st.from_regex(r"[a-z][a-z0-9_-]{0,12}", fullmatch=True), label="name") + ".diff"
    rel = f"plans/bad/{name}"
    plan["variants"][i] = dict(plan["variants"][i], source_patch=rel, patch={})
    plan["variants"][i].pop("requires", None)
    with box_dir() as d:
        (d / "plans").unlink()
        shutil.copytree(ROOT / "plans", d / "plans", ignore=shutil.ignore_patterns("closeouts", "campaigns"))
        if kind != "missing":
            (d / "plans" / "bad").mkdir()
            body = {"text": data.draw(st.text(max_size=200).filter(lambda s: "@@ " not in s), label="text").encode(),
                    "empty": b"", "binary": b"\x89PNG\r\n\x1a\n\xff\x00",
                    "half-diff": b"--- a/kernels/mla_decode.py\n+++ b/kernels/mla_decode.py\n no hunk header\n"}[kind]  # fmt: skip
            (d / "plans" / "bad" / name).write_bytes(body)
        f = d / "plan.yaml"
        f.write_text(dump_plan(plan))
        vid = plan["variants"][i]["id"]
        refused_in_box(["run", str(f), "--backend", "replay", "--approval", "auto"], f"plan: source_patch ({kind})", d,
                       all_needles=(f"variants.{vid}.source_patch", name))  # fmt: skip


too_many_heads = st.integers(1, 64).flatmap(
    lambda tp: st.integers(129, 1024 // tp if 1024 // tp > 129 else 129).map(lambda local: (local * tp, tp)))


@settings_for(40)
@given(ht=too_many_heads.filter(lambda ht: ht[0] <= 1024))
def test_plan_too_many_local_heads(ht):
    """More heads per GPU (heads / attention_tp) than the MLA adapter's largest head tile: refused at load."""
    heads, tp = ht
    plan = copy.deepcopy(BASE_PLAN)
    plan["workload"]["model"].update(heads=heads, attention_tp=tp)
    expect_rejected("run", dump_plan(plan), "plan: too many local heads", ("workload.model",), strict=True)


@settings_for(60)
@given(data=st.data())
def test_plan_variant_outside_bounds(data):
    """A variant value (top level or in an override) the adapter allows but the plan's bounds do not."""
    plan = copy.deepcopy(BASE_PLAN)
    key = data.draw(st.sampled_from(sorted(plan["bounds"])), label="tunable")
    outside = [v for v in MLA.spec.tunable(key).values if v not in plan["bounds"][key]]
    value = data.draw(st.sampled_from(outside), label="value")
    i = data.draw(st.integers(0, len(plan["variants"]) - 1), label="variant")
    if data.draw(st.booleans(), label="in an override"):
        plan["variants"][i]["patch"] = {"overrides": [{"batch_max": 8, key: value}]}
    else:
        plan["variants"][i]["patch"] = {key: value}
    vid = plan["variants"][i]["id"]
    line = expect_rejected("run", dump_plan(plan), "plan: variant outside bounds", (f"variants.{vid}.patch",),
                           strict=True)  # fmt: skip
    assert f"{key}={value}" in line and "bounds" in line, line


# ---- ids, numbers, state dirs, environment --------------------------------------
ID_COMMANDS = [["approve"], ["reject", "--reason", "r"], ["resume"], ["todos"], ["experiments"], ["history"],
               ["report"], ["export"], ["adopt", "{id}", "V1"]]  # fmt: skip
bad_id = st.one_of(
    st.integers(65, 100_000).map(lambda n: "a" * n),
    st.tuples(st.sampled_from(["3a", "3a-V1-2", "#3a", "7-adopt"]), control_char | st.sampled_from([" ", "\t", "\n"]),
              st.booleans()).map(lambda t: t[0] + t[1] if t[2] else t[1] + t[0]),
    st.text(min_size=1, max_size=8).filter(lambda s: any(c.isspace() or not c.isprintable() for c in s)),
)  # fmt: skip


@settings_for(80)
@given(cmd=st.sampled_from(ID_COMMANDS), ident=bad_id, with_state=st.booleans())
def test_bad_ids_are_refused_short(cmd, ident, with_state):
    """An id with whitespace or control characters, or longer than any id kinv makes: one short line that
    shows it escaped and cut; nothing opened or created."""
    argv = [a.replace("{id}", ident) for a in cmd] if "{id}" in cmd else [*cmd, ident]
    with box_dir(with_state=with_state) as d:
        line = refused_in_box(argv, "cli: bad id", d, needles=("id",))
    assert len(line) < 300, line


@settings_for(40)
@given(n=st.one_of(st.integers(max_value=0), st.integers(min_value=1 << 63, max_value=10**40)),
       cmd=st.sampled_from(["show", "compare"]), with_state=st.booleans())
def test_experiment_ids_out_of_range(n, cmd, with_state):
    argv = [cmd, "--", str(n)] if cmd == "show" else [cmd, "--", "1", str(n)]
    with box_dir(with_state=with_state) as d:
        refused_in_box(argv, "cli: experiment id out of range", d, all_needles=(str(n)[:20],))


STATE_DIR_COMMANDS = [["doctor"], ["doctor", "--json"], ["status"], ["pending"], ["backups"], ["approve", "3a-V1-2"],
                      ["todos", "3a"], ["show", "1"], ["revert"], ["bench", "--plan", str(PLAN), "--backend", "replay"],
                      ["run", str(PLAN), "--backend", "replay", "--approval", "auto"]]  # fmt: skip


@settings_for(40)
@given(cmd=st.sampled_from(STATE_DIR_COMMANDS), how=st.sampled_from(["file --state-dir", "file env", "empty env"]))
def test_state_dir_that_is_a_file_or_empty(cmd, how):
    """--state-dir or KINV_STATE_DIR naming a regular file, or KINV_STATE_DIR set but empty: bad input."""
    with box_dir() as d:
        f = d / "not-a-dir"
        f.write_text("x")
        if how == "file --state-dir":
            refused_in_box([*cmd, "--state-dir", str(f)], "cli: state dir is a file", d, all_needles=(str(f), "file"))
        elif how == "file env":
            refused_in_box(cmd, "cli: state dir is a file", d, env={"KINV_STATE_DIR": str(f)}, all_needles=(str(f),))
        else:
            refused_in_box(cmd, "cli: empty KINV_STATE_DIR", d, env={"KINV_STATE_DIR": ""},
                           all_needles=("KINV_STATE_DIR",))  # fmt: skip


@settings_for(30)
@given(cmd=st.sampled_from([["approve", "3a-V1-2"], ["reject", "3a-V1-2", "--reason", "r"], ["todos", "3a"],
                            ["history", "3a"], ["show", "3"], ["resume", "3a"], ["status"]]))  # fmt: skip
def test_no_state_is_bad_input(cmd):
    with box_dir() as d:
        refused_in_box(cmd, "cli: no kinv state", d, all_needles=("no kinv state",))


@settings_for(40)
@given(value=st.one_of(st.sampled_from(["abc", "", " ", "0", "-1", "512 ", "5e2", "0x200", "9" * 30]),
                       st.text(min_size=1, max_size=10).filter(lambda s: not s.isdigit() and "\x00" not in s)),
       as_json=st.booleans())
def test_env_invalid_shell_value(value, as_json):
    """``kinv env`` in a shell whose TARGET_CTAS no run could use: exit 2, one line naming it."""
    with box_dir() as d:
        refused_in_box(["env", "--plan", str(PLAN), *(["--json"] if as_json else [])], "cli: env invalid shell value",
                       d, env={"TARGET_CTAS": value}, all_needles=("TARGET_CTAS",))  # fmt: skip


@settings_for(20)
@given(cmd=st.sampled_from([["bench", "--plan", str(PLAN), "--backend", "replay"],
                            ["noise", "--plan", str(PLAN), "--backend", "replay"],
                            ["run", str(PLAN), "--backend", "replay", "--approval", "auto"]]),
       where=st.sampled_from(["nonexistent", "empty-dir", "a-file"]))  # fmt: skip
def test_recordings_dir_without_recordings(cmd, where):
    with box_dir() as d:
        rec = d / where
        if where == "empty-dir":
            rec.mkdir()
        elif where == "a-file":
            rec.write_text("x")
        refused_in_box(cmd, "cli: KINV_RECORDINGS without recordings", d, env={"KINV_RECORDINGS": str(rec)},
                       all_needles=(where,))  # fmt: skip


# --------------------------------------------------------------------------- #
# a real process, the totals
# --------------------------------------------------------------------------- #
def test_real_process_one_line_no_torch(tmp_path):
    """A sample of the worst inputs through a real interpreter: real stderr, default stack, no torch import."""
    plans = {
        "deep.yaml": "[" * 100_000 + "]" * 100_000,
        "bomb.yaml": with_raw(("variants", 0, "patch", "overrides"), laughs(9, 10, False)),
        "binary.yaml": b"\x89PNG\r\n\x1a\n\xff\x00garbage",
        "unicode.yaml": with_raw(("kernel",), '"mla_decode\\u202e\\U0001f525"'),
        "traversal.yaml": dump_plan({**BASE_PLAN, "variants": [dict(BASE_PLAN["variants"][0], source_patch="../../etc/passwd")]}),
        "dup.yaml": dump_plan(BASE_PLAN) + "kernel: mla_decode\n",
        "bigint.yaml": with_raw(("workload", "model"), "{heads: " + "9" * 6000 + "}"),
        "old-model.yaml": dump_plan({**BASE_PLAN, "model": {"heads": 64, "attention_tp": 4, "shape": "v4flash"}}),
        "kernel-ref.yaml": dump_plan({**BASE_PLAN, "kernel": "no.such.module:Cls"}),
    }  # fmt: skip
    configs = {"deep.json": '{"BLOCK_T": ' + "[" * 200_000 + "]" * 200_000 + "}", "bad.json": '{"num_warps": 3}',
               "bigint.json": '{"num_warps": ' + "9" * 10_000 + "}", "latin1.json": '{"description": "caf\xe9"}'.encode("latin-1")}  # fmt: skip
    calls, named = [], []
    state = str(tmp_path / "state")
    for name, text in {**plans, **configs}.items():
        f = tmp_path / name
        f.write_bytes(text if isinstance(text, bytes) else text.encode())
        calls.append(["run", str(f), "--backend", "replay", "--approval", "auto", "--state-dir", state]
                     if name.endswith(".yaml") else
                     ["bench", "--plan", str(PLAN), "--config", str(f), "--backend", "replay", "--state-dir", state])  # fmt: skip
        named.append(str(f))
    for argv, name in [
        (["bench", "--plan", str(PLAN), "--variant", "NOT_A_TUNABLE=3"], "NOT_A_TUNABLE"),
        (["bench", "--plan", str(PLAN), "--variant", "num_warps=3", "--json"], "num_warps=3"),
        (["bench", "--plan", str(tmp_path / "missing.yaml")], str(tmp_path / "missing.yaml")),
        (["noise", "--plan", str(tmp_path / "missing.yaml")], str(tmp_path / "missing.yaml")),
        (["bench", "--plan", str(PLAN), "--backend", "nope"], "nope"),
        (["bench", "--plan", str(PLAN), "--levels", "1,8"], "--levels"),
    ]:
        calls.append(argv + (["--backend", "replay"] if "--backend" not in argv else []) + ["--state-dir", state])
        named.append(name)
    code = ("import json, sys\nfrom agent.cli import main\ncodes = [main(a) for a in json.loads(sys.argv[1])]\n"
            "print('CODES', codes, 'HEAVY', [m for m in ('torch', 'triton') if m in sys.modules])")  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT), KINV_STATE_DIR=str(tmp_path / "state"))
    env.pop("KINV_DEBUG", None)
    r = subprocess.run([sys.executable, "-c", code, json.dumps(calls)], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]
    assert f"CODES {[2] * len(calls)} HEAVY []" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    lines = r.stderr.splitlines()
    assert len(lines) == len(calls) and all(ln.startswith("kinv: ") for ln in lines), r.stderr
    for ln, name in zip(lines, named):
        assert name in ln, ln
    assert not (tmp_path / "state").exists()
    COUNTS["real process (plan+config+cli)"] += len(calls)


def test_at_least_1000_bad_inputs_all_refused_cleanly():
    if not COUNTS:
        pytest.skip("run the whole module: this test totals the others")
    total = sum(COUNTS.values())
    width = max(map(len, COUNTS))
    print(f"\nbad inputs refused with one line and exit 2: {total}")
    for cat, n in sorted(COUNTS.items()):
        print(
            f"  {cat:<{width}}  {n:5d}" + (f"   (+{FILTERED[cat]} generated valid, dropped)" if FILTERED[cat] else "")
        )
    plan_n = sum(n for c, n in COUNTS.items() if c.startswith("plan"))
    cfg_n = sum(n for c, n in COUNTS.items() if c.startswith("config"))
    cli_n = sum(n for c, n in COUNTS.items() if c.startswith("cli"))
    print(f"  plans: {plan_n}, configs: {cfg_n}, command-line arguments: {cli_n}")
    print("sample messages:")
    for cat, msgs in sorted(SAMPLES.items()):
        for m in msgs[:3]:
            print(f"  [{cat}] {m[:220]}")
    assert total >= 1000, COUNTS
    assert repo_hashes() == LIVE["repo_before"], "a bad input changed a file under kernels/"


@settings_for(40)
@given(data=st.data())
def test_plan_bad_expect(data):
    """expect is improvement or no_change; expect_levels are level labels of the workload and need no_change."""
    plan = copy.deepcopy(BASE_PLAN)
    kind = data.draw(st.sampled_from(["expect", "label", "without"]), label="kind")
    if kind == "expect":
        plan["expect"] = data.draw(st.sampled_from(["null", "equivalent", "Improvement", "", 1, None, True, ["no_change"]]),
                                   label="expect")  # fmt: skip
        field = "expect"
    elif kind == "label":
        plan["expect"] = "no_change"
        plan["expect_levels"] = [data.draw(not_a_label, label="label")]
        field = "expect_levels"
    else:
        plan["expect_levels"] = ["b1"]
        field = "expect_levels"
    expect_rejected("run", dump_plan(plan), f"plan: bad {field}", (field,))
