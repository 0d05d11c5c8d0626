"""Bad command-line arguments and environment, generated: `kinv bench --variant/--plan/...`, `kinv noise`,
`kinv run`, pids, recordings, backends, live configs, ids, state dirs and variables, and the same inputs
through a real process.  Each is one line naming the bad value, exit 2, nothing created (the contract:
tests/bad_input_cases.py)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.bad_input_cases import (
    BASE_CONFIG,
    BASE_PLAN,
    CONFIG,
    COUNTS,
    MLA,
    PARAMS,
    PLAN,
    RECORDED_BATCHES,
    ROOT,
    SAMPLES,
    assert_refused_at_least,
    box_dir,
    control_char,
    dump_plan,
    ident,
    laughs,
    refused_cleanly,
    refused_in_box,
    sandbox,  # noqa: F401  (this module's sandbox: a live config copy, the repo checked)
    scratch,
    settings_for,
    with_raw,
)

pytestmark = pytest.mark.slow  # the slow lane: kills, races, fuzzing, drills (python -m pytest -m slow)


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
    code = ("import json, sys\nfrom agent.cli.app import main\ncodes = [main(a) for a in json.loads(sys.argv[1])]\n"
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


def test_at_least_400_bad_cli_inputs_all_refused_cleanly():
    assert_refused_at_least("command-line arguments", ('cli', 'real process', 'kernel'), 400)
