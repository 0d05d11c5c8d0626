"""What the bad-input tests share (tests/agent/test_bad_plan.py, test_bad_config.py, test_bad_cli.py): the sandbox, the
contract a refusal is checked against, the valid plan and config they mutate, and the generators.

Every input there is bad.  Each must give exit code 2, exactly one stderr line
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
process.  Each surface's last test asserts how many inputs ran and prints the
breakdown (``pytest -rP tests/agent/test_bad_plan.py`` shows it).
"""

from __future__ import annotations

import atexit
import copy
import hashlib
import io
import json
import os
import shutil
import tempfile
from collections import Counter
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, reject, settings
from hypothesis import strategies as st

from kinv.agent.cli.app import main
from kinv.agent.plan_file import load_plan
from kinv.kernels.adapter import get_adapter
from kinv.kernels.launch_config import load_config
from tests.utils import SEED_MLA_CONFIG, write_seed_config

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


ident = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
# control and bidi characters: refused in titles and ids
control_char = st.one_of(st.characters(min_codepoint=0, max_codepoint=31), st.just("\x7f"),
                         st.characters(min_codepoint=0x80, max_codepoint=0x9f),
                         st.sampled_from(["\u202e", "\u202d", "\u2066", "\u2069", "\u200f", "\u2028", "\u2029"]))  # fmt: skip


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
        from kinv.agent.store.db import Store

        d = Path(tempfile.mkdtemp(prefix="kinv-bad-state-")) / "state"
        atexit.register(shutil.rmtree, d.parent, True)  # the template outlives each test, not the run
        s = Store(d)
        s.upsert_workstream({"id": "#3a", "title": "t", "kernel": "mla_decode", "plan_path": str(PLAN), "status": "open"})
        s.conn.close()
        _STATE["dir"] = d
    return _STATE["dir"]


def assert_refused_at_least(surface: str, prefixes: tuple[str, ...], minimum: int) -> None:
    """The inputs of one surface (categories starting with one of ``prefixes``) that ran in this process: at
    least ``minimum``, every one refused cleanly; prints the breakdown and a few of the messages."""
    mine = {c: n for c, n in COUNTS.items() if c.startswith(prefixes)}
    if not mine:
        pytest.skip("run the whole module: this test totals the others")
    total = sum(mine.values())
    width = max(map(len, mine))
    print(f"\nbad {surface} refused with one line and exit 2: {total}")
    for cat, n in sorted(mine.items()):
        print(f"  {cat:<{width}}  {n:5d}" + (f"   (+{FILTERED[cat]} generated valid, dropped)" if FILTERED[cat] else ""))
    print("sample messages:")
    for cat, msgs in sorted(SAMPLES.items()):
        if cat in mine:
            for m in msgs[:3]:
                print(f"  [{cat}] {m[:220]}")
    assert total >= minimum, mine
    assert repo_hashes() == LIVE["repo_before"], "a bad input changed a file under kernels/"
