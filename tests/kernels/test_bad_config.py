"""Bad config files (`kinv bench --config FILE`), generated: wrong types, unknown keys, bad values, missing
fields, mangled overrides, broken JSON, huge and unicode text, duplicate keys.  Each is one line naming the
file and the field, exit 2, nothing created (the contract: tests/bad_input_cases.py)."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, reject
from hypothesis import strategies as st

from tests.bad_input_cases import (
    BASE_CONFIG,
    PARAMS,
    any_value,
    assert_refused_at_least,
    expect_rejected,
    keys,
    sandbox,  # noqa: F401  (this module's sandbox: a live config copy, the repo checked)
    scalars,
    settings_for,
    unicode_text,
    wrong_type_for,
)

pytestmark = pytest.mark.slow  # the slow lane: kills, races, fuzzing, drills (python -m pytest -m slow)


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


def test_at_least_350_bad_config_inputs_all_refused_cleanly():
    assert_refused_at_least("configs", ('config',), 350)
