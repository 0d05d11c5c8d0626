"""The command backend: one run of the plan's command per sample, its metric read from what it prints.

``kernel: command`` plans (kinv/kernels/command_adapter.py) say the command, its metric (a JSON key of the last
JSON object it prints, or a regular expression) and its levels.  Each arm is the command in the arm's own
environment (the plan's, with a variant's ``env`` on top).  Opening an arm runs the command once at its first level
and reads ``/proc/<pid>/environ`` of that very process while it runs: the env check is about the process that was
measured.  The rounds, ABBA order, A/A and decisions are the protocol's, unchanged; a sample is one run, its time
the reciprocal of a higher-is-better metric (so a throughput change is ``expm1(effect)``) or the metric itself.

A timed run that fails, times out or prints no metric loses that sample with one recorded line naming the level and
what it printed last (agent/tools/protocol.py drops it; an arm that loses too many fails); a warm-up or the
correctness check that fails fails its arm.  Every run's whole output is kept under ``<state>/commands/``.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import time
from pathlib import Path

from kinv.agent.tools.backends.base import Arm, Backend, VariantFailed
from kinv.kernels.adapter import Level


def _logs(where: Path | None) -> Path:
    """Where runs' outputs are kept: ``<state>/commands`` of the run (the backend is told), else the default
    state dir's."""
    from kinv.agent.store import state_dir

    d = where or state_dir(None) / "commands"
    d.mkdir(parents=True, exist_ok=True)
    return d


def metric_of(text: str, metric: dict) -> float | None:
    """The metric in a run's output: the JSON key of the last line that is a JSON object, or the regex's first
    group (its last match)."""
    if metric.get("json_key"):
        for line in reversed(text.splitlines()):
            line = line.strip()
            if not (line.startswith("{") and line.endswith("}")):
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            for part in metric["json_key"].split("."):
                obj = obj.get(part) if isinstance(obj, dict) else None
            return float(obj) if isinstance(obj, int | float) and not isinstance(obj, bool) else None
        return None
    found = re.findall(metric["regex"], text)
    if not found:
        return None
    last = found[-1]
    try:
        return float(last[0] if isinstance(last, tuple) else last)
    except ValueError:
        return None


def _environ_of(proc: subprocess.Popen, names: list[str]) -> dict | None:
    """The listed variables of ``proc``'s environment, read from ``/proc``.  ``Popen`` returns only once the child
    has exec'd the command, so this is the measured process's own environment; None when it could not be read
    (it ended first: a reaped process has none)."""
    from kinv.agent.tools import envcheck

    try:
        seen = envcheck.proc_environ(proc.pid)
    except Exception:  # noqa: BLE001 - it ended meanwhile: unseen
        return None
    return {k: seen.get(k) for k in names} if seen else None


class CommandArm(Arm):
    def run(self, level: Level, tag: str, watch_env: bool = False) -> tuple[float, float, dict | None]:
        """One run at ``level``: ``(metric, wall seconds, environment seen or None)``; VariantFailed with one line
        when it fails, hangs past its timeout or prints no metric."""
        from kinv.kernels.adapter import get_adapter

        run = level.dims["_run"]
        argv = get_adapter("command").argv(level)
        env = {**os.environ, **{k: str(v) for k, v in self.env.items()}}
        t0 = time.perf_counter()
        seen = None
        try:
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except OSError as exc:
            raise VariantFailed(f"{self.name} at {level.key}: cannot start {argv[0]}: {exc.strerror}") from None
        if watch_env:
            seen = _environ_of(proc, sorted(self.env))
        try:
            out, _ = proc.communicate(timeout=run["timeout_s"])
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            self._keep(level, tag, out)
            raise VariantFailed(f"{self.name} at {level.key}: the command ran past its {run['timeout_s']:g} s timeout") from None
        wall = time.perf_counter() - t0
        log = self._keep(level, tag, out)
        if proc.returncode != 0:
            last = next((ln for ln in reversed(out.splitlines()) if ln.strip()), "no output")
            raise VariantFailed(f"{self.name} at {level.key}: the command exited {proc.returncode} ({last[:160]}); "
                                f"output kept at {log}")  # fmt: skip
        value = metric_of(out, run["metric"])
        if value is None or value <= 0:
            raise VariantFailed(f"{self.name} at {level.key}: the command printed no positive metric "
                                f"({run['metric'].get('json_key') or run['metric'].get('regex')}); output kept at {log}")  # fmt: skip
        return value, wall, seen

    def _keep(self, level: Level, tag: str, out: str) -> Path:
        f = _logs(getattr(self, "log_dir", None)) / f"{self.name}-{level.key.replace('/', '_')}-{tag}.log"
        f.write_text(out or "")
        return f

    def setup(self, level: Level) -> dict:
        for i in range(int(level.dims["_run"].get("warmup", 0))):
            self.run(level, f"warmup{i}")
        s = {"level": level.key, "correct": True, "derived_env": {}}
        self.setups[level.key] = s
        return s

    def sample(self, level: Level, round_index: int) -> dict:
        """One run's sample; a run that fails, hangs or prints no metric is a lost sample (``lost``: its one
        line), which the protocol records and drops, never the investigation."""
        from kinv.kernels.adapter import get_adapter

        t0 = time.perf_counter()
        try:
            value, wall, _ = self.run(level, f"r{round_index}")
        except VariantFailed as exc:
            return {"us": None, "lost": str(exc), "replays": 0, "gpu_s": time.perf_counter() - t0}
        return {"us": get_adapter("command").time_us(level, value), "replays": 1, "gpu_s": wall, "metric": value}


class CommandBackend(Backend):
    name = "command"
    time_word = "time in the command's runs"
    each_sample = "every sample is one fresh run of the command in the arm's environment"
    loud = "COMMAND backend: each sample is one run of the plan's command; its metric is what it prints"

    def __init__(self):
        self.first_levels: list[Level] = []
        self.log_dir: Path | None = None  # the run's <state>/commands (agent/investigation.py sets it)

    def open(self, name, kernel, config, env, replica=None, pythonpath=None, partner=None, role="variant") -> Arm:
        arm = CommandArm(name=name, kernel=kernel, config=config, env=dict(env))
        arm.log_dir = self.log_dir
        arm.fingerprint = {"gpu": f"command on {platform.node()}", "arch": platform.machine(),
                           "cpus": os.cpu_count(), "python": platform.python_version()}  # fmt: skip
        if self.first_levels:  # the env check reads the environment of a real run of the command
            _, _, seen = arm.run(self.first_levels[0], "env", watch_env=True)
            arm.env_seen = seen if seen is not None else {k: None for k in env}
        return arm

    def preflight(self, kernel: str, env: dict, levels: list[Level], arms=()) -> None:
        from kinv.kernels.errors import BadInput

        if kernel != "command":
            raise BadInput(f"--backend command measures plans of kernel 'command'; this plan's kernel is {kernel!r}")
        self.first_levels = list(levels[:1])

    def check(self, kernel: str, config: dict, levels: list[Level], *, seed: int, device: str, env: dict,
              pythonpath=None) -> dict:  # fmt: skip
        """The command's own gate: it exits 0 and prints its metric at every level, in the arm's environment."""
        self.first_levels = self.first_levels or list(levels[:1])
        arm = CommandArm(name="check", kernel=kernel, config=config, env=dict(env))
        arm.log_dir = self.log_dir
        rows = []
        for lv in levels:
            try:
                value, wall, _ = arm.run(lv, f"check-{seed}")
            except VariantFailed as exc:
                rows.append({"level": lv.key, "ok": False})
                return {"ok": False, "levels": rows, "seed": seed, "device": "command", "dtype": "n/a",
                        "reason": f"launch failed: {exc}", "what": f"the command failed: {exc}"}  # fmt: skip
            rows.append({"level": lv.key, "ran": lv.key, "ok": True, "metric": value, "wall_s": round(wall, 3)})
        return {"ok": True, "levels": rows, "seed": seed, "device": "command", "dtype": "n/a", "reason": "",
                "what": f"the command exited 0 and printed its metric at {len(rows)} level(s); checking its results "
                        "is the command's own business"}  # fmt: skip

    def describe(self) -> str:
        return "command"
