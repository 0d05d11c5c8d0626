"""Bad plan files (`kinv run PLAN`), generated: wrong types, missing and unknown keys, huge numbers, unicode,
path traversal, the adapter-owned workload, YAML bombs, broken and raw YAML, control characters.  Each is one
line naming the file and the field, exit 2, nothing created (the contract: tests/bad_input_cases.py)."""

from __future__ import annotations

import copy
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given, reject
from hypothesis import strategies as st

from kinv.agent.plan_file import MAX_PLAN_BYTES, load_plan
from kinv.kernels.launch_config import load_config
from tests.bad_input_cases import (
    ALL_PATHS,
    BASE_CONFIG,
    BASE_PLAN,
    BOMB_SLOTS,
    CONFIG,
    CONSTRAINED_STRINGS,
    HUGE,
    LABELS,
    LIMITED_STRINGS,
    MAPPING_PATHS,
    MLA,
    N_VARIANTS,
    NUMERIC_PATHS,
    OPTIONAL,
    PARAMS,
    PLACEHOLDER,
    RAW_NEEDLES,
    REQUIRED,
    ROOT,
    TOP_KEYS,
    any_value,
    assert_refused_at_least,
    bombs,
    box_dir,
    control_char,
    del_at,
    dump_plan,
    expect_rejected,
    field_needles,
    get_at,
    ident,
    keys,
    refused_in_box,
    sandbox,  # noqa: F401  (this module's sandbox: a live config copy, the repo checked)
    scalars,
    set_at,
    settings_for,
    unicode_text,
    with_raw,
    wrong_type_for,
)

pytestmark = pytest.mark.slow  # the slow lane: kills, races, fuzzing, drills (python -m pytest -m slow)


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
    "agent/cli/app.py", "tests/x.diff", "C:\\Windows\\x", "\\\\server\\share\\x", "plans/../kernels/../../x",
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


# ---- plans refused at load time --------------------------------------------------
title_fields = [("workstream", "title"), ("workstream", "parent_title"), ("variants", 0, "title"),
                ("variants", 1, "title"), ("backlog", 0, "title")]  # fmt: skip
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


def test_at_least_1000_bad_plan_inputs_all_refused_cleanly():
    assert_refused_at_least("plans", ('plan',), 1000)
