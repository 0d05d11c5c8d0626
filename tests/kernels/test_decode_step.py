"""The seed's loop on kinv's own kernels: one decode step of a V4-Flash-like layer (MLA attention and the routed
experts through kinv's Triton kernels, the rest in torch), reading TARGET_CTAS and the attention config as a
serving process does.  Here in the Triton interpreter at tiny dimensions: the numbers are the interpreter's, the
plumbing (configs, split rule, correctness checks, server and client, kinv's server mode) is the real one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.utils import kinv_in_process, replay_env

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "decode_step.py"
SEED = ROOT / "plans" / "configs" / "3d-seed-bt16.json"


def _env(**extra):
    return {**os.environ, "TRITON_INTERPRET": "1", "KINV_FORCE_NO_GPU": "1", "KINV_MLA_CONFIG": str(SEED), **extra}


def _run(*args, **env):
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=_env(**env), capture_output=True, text=True,
                          timeout=300, cwd=ROOT)  # fmt: skip


def test_one_step_prints_tokens_per_second_and_attentions_share_under_the_process_environment():
    r = _run("run", "--concurrency", "2", "--context", "64", "--tiny", TARGET_CTAS="512")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["tokens_per_s"] == pytest.approx(2 / (out["step_us"] * 1e-6), rel=1e-3)
    assert 0 < out["attention_share"] < 1 and out["TARGET_CTAS"] == 512 and out["TARGET_CTAS_env"] == "512"
    assert out["attention_share"] == pytest.approx(out["attention_us"] / out["step_us"], abs=1e-3)
    assert 0 < out["moe_share"] < 1 and out["moe_us"] > 0 and out["timing"] == "eager" and out["steps_timed"] >= 3
    assert out["C"] == 2 and out["context"] == 64 and out["split_rule"] == "TARGET_CTAS" and out["tiny"] is True
    assert out["attention_rel_err"] < 1e-3 and out["routed_rel_err"] < 1e-3  # float32 in the interpreter
    assert out["mla_config"] == "BT16/BH16/w4/s2"  # the file KINV_MLA_CONFIG names, resolved at C=2
    assert out["num_splits"] == 4  # 512 / (2 requests x 1 head tile), capped at the 4 tiles of 64 tokens
    fewer = json.loads(_run("run", "--concurrency", "2", "--context", "64", "--tiny",
                            TARGET_CTAS="2").stdout.strip().splitlines()[-1])  # fmt: skip
    assert fewer["num_splits"] == 1 and fewer["TARGET_CTAS"] == 2


@pytest.mark.parametrize("bad, says", [
    ({"TARGET_CTAS": "many"}, "TARGET_CTAS='many' is not an integer"),
    ({"TARGET_CTAS": "0"}, "TARGET_CTAS=0 must be a positive integer"),
    ({"TARGET_CTAS": "99999999"}, "must be an integer from 1 to"),
    ({"KINV_MLA_CONFIG": "/nonexistent/mla.json"}, "KINV_MLA_CONFIG=/nonexistent/mla.json"),
    ({"KINV_MLA_CONFIG": "{bad}"}, "config is missing 'BLOCK_H'"),
    ({"KINV_MOE_CONFIG": "{bad}"}, "KINV_MOE_CONFIG="),
])  # fmt: skip
def test_a_bad_environment_is_one_line_and_exit_2(bad, says, tmp_path):
    cfg = tmp_path / "bad.json"
    cfg.write_text('{"kernel": "mla_decode", "BLOCK_T": 16}')
    bad = {k: v.replace("{bad}", str(cfg)) for k, v in bad.items()}
    r = _run("run", "--concurrency", "2", "--context", "64", "--tiny", **bad)
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.mark.parametrize("kernel, launch, says", [
    ("mla_decode", "mla_decode_launch", "attention (MLA decode, BT16/BH16/w4/s2) disagrees with kinv's reference"),
    ("moe_expert_gemm", "moe_expert_gemm_launch", "routed experts (grouped GEMM, BM16/BN32/BK64/G1/w4/s3) disagree"),
])  # fmt: skip
def test_a_kernel_that_writes_nothing_fails_the_check_with_one_line_and_exit_3(kernel, launch, says, monkeypatch,
                                                                              capsys):  # fmt: skip
    """Outputs are NaN-filled before the check: a launch that leaves them unwritten cannot pass."""
    import importlib
    import importlib.util

    monkeypatch.setenv("KINV_MLA_CONFIG", str(SEED))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    mod = importlib.import_module(f"kinv.kernels.{kernel}")
    monkeypatch.setattr(mod, launch, lambda *a, out=None, **k: (out, None))
    spec = importlib.util.spec_from_file_location("decode_step_under_test", SCRIPT)
    step = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step)
    assert step.main(["run", "--concurrency", "2", "--context", "64", "--tiny", "--seconds", "0.1"]) == 3
    err = capsys.readouterr()
    assert says in err.err and "not finite" in err.err, err.err
    assert len(err.err.strip().splitlines()) == 1 and "Traceback" not in err.err and err.out == ""


def test_the_client_imports_no_torch_and_says_when_no_server_answers():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    code = "\n".join([
        "import runpy, sys",
        f"sys.argv = ['decode_step.py', 'client', '--port', '{port}', '--concurrency', '2']",
        "try:",
        f"    runpy.run_path({str(SCRIPT)!r}, run_name='__main__')",
        "except SystemExit as e:",
        "    print('torch' in sys.modules, e.code)",
    ])  # fmt: skip
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.stdout.split() == ["False", "1"], r.stdout + r.stderr
    assert "no answer from a server at http://127.0.0.1:" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_server_answers_ready_then_a_client_per_level_and_stops_on_sigterm(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = subprocess.Popen([sys.executable, str(SCRIPT), "serve", "--port", str(port), "--levels", "1,2", "--context",
                            "64", "--tiny"], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           cwd=ROOT)  # fmt: skip
    try:
        deadline = time.time() + 120
        while True:
            r = _run("client", "--port", str(port), "--concurrency", "2", "--seconds", "0.1")
            if r.returncode == 0 or time.time() > deadline or srv.poll() is not None:
                break
            time.sleep(0.5)
        assert r.returncode == 0, r.stderr + (srv.stderr.read() if srv.poll() is not None else "")
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["C"] == 2 and 0 < out["attention_share"] < 1 and out["num_splits"] == 4
        assert out["tokens_per_s"] == pytest.approx(2 / (out["step_us"] * 1e-6), rel=1e-3)
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=30) as ready:
            assert ready.status == 200 and json.loads(ready.read())["ready"] == [1, 2]
        r = _run("client", "--port", str(port), "--concurrency", "5")
        assert r.returncode == 1 and "C=5 is not served" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    finally:
        srv.send_signal(signal.SIGTERM)
        assert srv.wait(timeout=30) == 0


@pytest.mark.slow
def test_the_end_to_end_plan_runs_through_kinvs_server_mode_on_the_interpreter(tmp_path):
    """plans/3d-end-to-end.yaml at tiny dimensions: a server per arm, TARGET_CTAS as the variant, the attention's
    share and split count kept per arm beside tokens/s."""
    data = yaml.safe_load((ROOT / "plans" / "3d-end-to-end.yaml").read_text())
    w = data["workload"]
    w["server"]["command"] += ["--context", "64", "--tiny"]
    w["server"]["command"][w["server"]["command"].index("1,8,32,64,96")] = "1,2"
    w["server"]["ready_timeout_s"] = 120
    w["levels"] = [{"C": 1}, {"C": 2}]
    data["environment"]["KINV_MLA_CONFIG"] = str(SEED)
    data["variants"] = [{**data["variants"][0], "env": {"TARGET_CTAS": "1"}}]
    data["stats"].update(threshold=0.3, quick_rounds=2, step_rounds=2, max_rounds=4)  # what is checked is the close-out, not a verdict
    plan = tmp_path / "3d-tiny.yaml"
    plan.write_text(yaml.safe_dump(data))
    env = replay_env(tmp_path, tmp_path / "state")
    r = kinv_in_process(env, "run", str(plan), "--approval", "auto")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    text = (tmp_path / "state" / "reports" / "3d-closeout.md").read_text()
    assert "TARGET_CTAS=1 in its processes (the baseline's: 512)" in text
    assert "Also printed by the command" in text and "num_splits" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| C2 |") and "→" in ln)
    assert "4 → 1" in row, row  # splits: 512 targets split C=2's 64 tokens into all 4 tiles, TARGET_CTAS 1 into one
