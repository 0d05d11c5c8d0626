"""The command backend: one run of the plan's command per sample, its metric read from what it prints.

``kernel: command`` plans (kinv/kernels/command_adapter.py) say the command, its metric (a JSON key of the last
JSON object it prints, or a regular expression) and its levels.  Each arm is the command in the arm's own
environment (the plan's, with a variant's ``env`` on top).  Opening an arm runs the command once at its first level
and reads ``/proc/<pid>/environ`` of that very process while it runs: the env check is about the process that was
measured.  The rounds, ABBA order, A/A and decisions are the protocol's, unchanged; a sample is one run, its time
the reciprocal of a higher-is-better metric (so a throughput change is ``expm1(effect)``) or the metric itself.

A timed run that fails, times out or prints no metric loses that sample with one recorded line naming the level and
what it printed last (agent/tools/measure/protocol.py drops it; an arm that loses too many fails); a warm-up or the
correctness check that fails fails its arm.  Every run's whole output is kept under ``<state>/commands/``, one file
per run named by experiment, arm, level, round and tag (``e12-baseline-n512-r3.log``; :func:`keep`), never
overwritten: a name already taken (a resumed run, another process of the same state dir) gets ``.2``, ``.3``, ...
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import time
from pathlib import Path

from kinv.agent.errors import VariantFailed
from kinv.agent.tools.backends.base import Arm, Backend
from kinv.kernels.adapter import Level


def _logs(where: Path | None) -> Path:
    """Where runs' outputs are kept: ``<state>/commands`` of the run (the backend is told), else the default
    state dir's."""
    from kinv.agent.store.state import state_dir

    d = where or state_dir(None) / "commands"
    d.mkdir(parents=True, exist_ok=True)
    return d


def keep(directory: Path, stem: str, text: str) -> Path:
    """Write ``text`` to ``<directory>/<stem>.log``, or ``<stem>.2.log``, ``.3``, ... when that name is taken: created
    exclusively, so that no run's output ever replaces another's, whichever process wrote first."""
    for i in range(1, 10_000):
        f = directory / (f"{stem}.log" if i == 1 else f"{stem}.{i}.log")
        try:
            with open(f, "x") as fh:
                fh.write(text)
            return f
        except FileExistsError:
            continue
    raise VariantFailed(f"{directory}: 10000 logs named {stem}; clear old ones")


def log_stem(experiment: int | None, arm: str, level_key: str, tag: str) -> str:
    """The name of one run's log: experiment, arm, level, round or tag (``e12-V1-n512-r3``)."""
    safe = lambda s: re.sub(r"[^A-Za-z0-9_.=+-]", "_", str(s))  # noqa: E731
    return "-".join(([f"e{experiment}"] if experiment is not None else []) + [safe(arm), safe(level_key), safe(tag)])


def _last_json(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if not (line.startswith("{") and line.endswith("}")):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def _key(obj, dotted: str) -> float | None:
    for part in dotted.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return float(obj) if isinstance(obj, int | float) and not isinstance(obj, bool) else None


def also_of(text: str, metric: dict) -> dict[str, float]:
    """The ``also`` keys of the metric's JSON object (those it printed as numbers)."""
    obj = _last_json(text) if metric.get("also") else None
    got = {k: _key(obj, k) for k in metric.get("also") or ()} if obj else {}
    return {k: v for k, v in got.items() if v is not None}


def metric_of(text: str, metric: dict) -> float | None:
    """The metric in a run's output: the JSON key of the last line that is a JSON object, or the regex's first
    group (its last match)."""
    if metric.get("json_key"):
        obj = _last_json(text)
        return _key(obj, metric["json_key"]) if obj is not None else None
    found = re.findall(metric["regex"], text)
    if not found:
        return None
    last = found[-1]
    try:
        return float(last[0] if isinstance(last, tuple) else last)
    except ValueError:
        return None


ENV_READ_S = 2.0  # how long the env check keeps trying to read a run's environment while the run is alive
ENV_TRIES = 5  # runs of the command the env check may start before it says it could not see one


def _environ_of(proc: subprocess.Popen, names: list[str]) -> dict | None:
    """The listed variables of ``proc``'s environment, read from ``/proc/<pid>/environ`` while it runs: the
    measured process's own environment.  Just after ``Popen`` returns, the file reads empty while the exec is
    completing, and a short command can end a few milliseconds later (a zombie's reads empty for good): it is read
    again every fraction of a millisecond, not every 20 ms, until it has the environment or the process ended.
    None when it ended first (unseen, which is not unset)."""
    from kinv.agent.tools.backends.environ import proc_environ

    deadline = time.perf_counter() + ENV_READ_S
    while True:
        try:
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                raw = f.read()
        except OSError:
            raw = b""
        if raw:
            seen = {}
            for item in raw.split(b"\0"):
                key, eq, value = item.partition(b"=")
                if eq:
                    seen[os.fsdecode(key)] = os.fsdecode(value)
            return {k: seen.get(k) for k in names}
        if proc.poll() is not None or time.perf_counter() > deadline:
            if not os.path.isdir("/proc/self"):
                proc_environ(proc.pid)  # no /proc here: its one line (bad input), as a pid check says
            return None
        time.sleep(0.0002)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """One arm's long-lived server: started in the arm's environment, ready once its probe answers 200."""

    def __init__(self, spec: dict, env: dict, log: Path, name: str, cwd: Path | None = None):
        import sys
        import urllib.request

        self.spec, self.env, self.name, self.port = spec, env, name, _free_port()
        argv = [p.format(python=sys.executable, port=self.port) for p in spec["command"]]
        self.log = log
        self._out = open(log, "a")  # noqa: SIM115 - the server's output, for its life (its file made by keep)
        try:
            self.proc = subprocess.Popen(argv, env={**os.environ, **{k: str(v) for k, v in env.items()}},
                                         stdout=self._out, stderr=subprocess.STDOUT, text=True, cwd=cwd)  # fmt: skip
        except OSError as exc:
            self._out.close()
            raise VariantFailed(f"{name}: cannot start the server {argv[0]}: {exc.strerror}") from None
        url = spec["ready_url"].format(python=sys.executable, port=self.port)
        deadline = time.monotonic() + spec["ready_timeout_s"]
        while True:
            if self.proc.poll() is not None:
                self._out.close()
                raise VariantFailed(f"{name}: the server exited {self.proc.returncode} before it was ready; "
                                    f"output kept at {log}")  # fmt: skip
            try:
                with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - the plan's own local probe
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise VariantFailed(f"{name}: the server was not ready at {url} within {spec['ready_timeout_s']:g} s; "
                                    f"output kept at {log}")  # fmt: skip
            time.sleep(0.2)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()


class ServerPool:
    """Servers kept between arms of one run, by environment: the check's server serves its variant's arm, the
    baseline's serves every A/B, and an A/A's replicas are separate servers.  ``close`` stops them all."""

    def __init__(self):
        self.idle: dict[tuple, list[Server]] = {}
        self.started = 0
        self.experiment: int | None = None  # whose servers start now (their logs are named by it)

    def take(self, spec: dict, env: dict, log_dir: Path, name: str, cwd: Path | None = None) -> Server:
        key = (json.dumps(spec, sort_keys=True), tuple(sorted((k, str(v)) for k, v in env.items())), str(cwd))
        while self.idle.get(key):
            srv = self.idle[key].pop()
            if srv.alive():
                return srv
            srv.stop()
        self.started += 1
        srv = Server(spec, env, keep(log_dir, f"server-{log_stem(self.experiment, name, 'all', self.started)}", ""),
                     name, cwd)  # fmt: skip
        srv.key = key
        return srv

    def give(self, srv: Server) -> None:
        if srv.alive():
            self.idle.setdefault(srv.key, []).append(srv)
        else:
            srv.stop()

    def close(self) -> None:
        for servers in self.idle.values():
            for srv in servers:
                srv.stop()
        self.idle.clear()


class CommandArm(Arm):
    def run(self, level: Level, tag: str, watch_env: bool = False) -> tuple[float, float, dict | None]:
        """One run at ``level``: ``(metric, wall seconds, environment seen or None)``; VariantFailed with one line
        when it fails, hangs past its timeout or prints no metric."""
        from kinv.kernels.adapter import get_adapter

        run = level.dims["_run"]
        srv = self.serve(level) if run.get("server") else None
        argv = get_adapter("command").argv(level, port=srv.port if srv else None, env=self.env)
        env = {**os.environ, **{k: str(v) for k, v in self.env.items()}}
        t0 = time.perf_counter()
        seen = None
        try:
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    cwd=self.cwd)  # fmt: skip
        except OSError as exc:
            raise VariantFailed(f"{self.name} at {level.key}: cannot start {argv[0]}: {exc.strerror}") from None
        if watch_env:  # the process that measures: the server where there is one, else this run
            seen = _environ_of(srv.proc if srv else proc, sorted(self.env))
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
        self._also = also_of(out, run["metric"])
        return value, wall, seen

    server_obj: Server | None = None
    pool: ServerPool | None = None
    cwd: Path | None = None  # where the command runs: a revision's own checkout (kinv regress), else here
    _round: int = -1
    _also: dict = {}

    def serve(self, level: Level) -> Server:
        """This arm's server, started (or taken from the pool) on first use; a server that died is started again
        (the sample that found it dead is lost)."""
        if self.server_obj is not None and not self.server_obj.alive():
            self.server_obj.stop()
            self.server_obj = None
        if self.server_obj is None:
            pool = self.pool or ServerPool()
            self.pool = pool
            self.server_obj = pool.take(level.dims["_run"]["server"], self.env, _logs(getattr(self, "log_dir", None)),
                                        self.name, self.cwd)  # fmt: skip
        return self.server_obj

    def close(self) -> None:
        if self.server_obj is not None:
            self.pool.give(self.server_obj)
            self.server_obj = None

    experiment: int | None = None

    def _keep(self, level: Level, tag: str, out: str) -> Path:
        stem = log_stem(self.experiment, self.name, level.key, tag)
        return keep(_logs(getattr(self, "log_dir", None)), stem, out or "")

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
        srv = level.dims["_run"].get("server")
        if srv and srv["restart"] == "round" and self.server_obj is not None and round_index != self._round:
            self.server_obj.stop()  # a fresh server for every round, as the plan says
            self.server_obj = None
        self._round = round_index
        try:
            value, wall, _ = self.run(level, f"r{round_index}")
        except VariantFailed as exc:
            return {"us": None, "lost": str(exc), "replays": 0, "gpu_s": time.perf_counter() - t0}
        also = self.__dict__.setdefault("also", {})  # level -> key -> this arm's values (for the close-out)
        for k, v in self._also.items():
            also.setdefault(level.key, {}).setdefault(k, []).append(v)
        return {"us": get_adapter("command").time_us(level, value), "replays": 1, "gpu_s": wall, "metric": value}


class CommandBackend(Backend):
    name = "command"
    time_word = "time in the command's runs"
    each_sample = "every sample is one fresh run of the command in the arm's environment"
    loud = "COMMAND backend: each sample is one run of the plan's command; its metric is what it prints"

    def __init__(self):
        self.first_levels: list[Level] = []
        self.log_dir: Path | None = None  # the run's <state>/commands (agent/workstream/investigation.py sets it)
        self.servers = ServerPool()
        import atexit

        atexit.register(self.servers.close)  # whatever ends the process, no server outlives it

    def _arm(self, name: str, kernel: str, config: dict, env: dict, checkout: list[str] | None = None) -> CommandArm:
        """An arm of the command; ``checkout`` (an arm's ``pythonpath``): a revision's own checkout, where its
        command and server run (``kinv regress``), else the working directory."""
        arm = CommandArm(name=name, kernel=kernel, config=config, env=dict(env))
        arm.log_dir, arm.pool, arm.experiment = self.log_dir, self.servers, self.experiment
        self.servers.experiment = self.experiment
        arm.cwd = Path(checkout[0]) if checkout else None
        return arm

    def open(self, name, kernel, config, env, replica=None, pythonpath=None, partner=None, role="variant", judge_path=None) -> Arm:
        arm = self._arm(name, kernel, config, env, pythonpath)
        arm.fingerprint = {"gpu": f"command on {platform.node()}", "arch": platform.machine(),
                           "cpus": os.cpu_count(), "python": platform.python_version()}  # fmt: skip
        if self.first_levels:  # the env check reads the environment of a real run of the command
            for _ in range(ENV_TRIES):  # a run that ended before its environment could be read is run again
                _, _, seen = arm.run(self.first_levels[0], "env", watch_env=True)
                if seen is not None:
                    break
            else:
                raise VariantFailed(f"{name}: the env check could not read the environment of the command: each of "
                                    f"{ENV_TRIES} runs ended before /proc/<pid>/environ could be read")  # fmt: skip
            arm.env_seen = seen
        return arm

    def preflight(self, kernel: str, env: dict, levels: list[Level], arms=()) -> None:
        from kinv.kernels.errors import BadInput

        if kernel != "command":
            raise BadInput(f"--backend command measures plans of kernel 'command'; this plan's kernel is {kernel!r}")
        self.first_levels = list(levels[:1])

    def check(self, kernel: str, config: dict, levels: list[Level], *, seed: int, device: str, env: dict,
              pythonpath=None, judge_path=None) -> dict:  # fmt: skip
        """The command's own gate: it exits 0 and prints its metric at every level, in the arm's environment."""
        self.first_levels = self.first_levels or list(levels[:1])
        arm = self._arm("check", kernel, config, env, pythonpath)
        rows = []
        try:
            for lv in levels:
                try:
                    value, wall, _ = arm.run(lv, "check")
                except VariantFailed as exc:
                    rows.append({"level": lv.key, "ok": False})
                    return {"ok": False, "levels": rows, "seed": seed, "device": "command", "dtype": "n/a",
                            "reason": f"launch failed: {exc}", "what": f"the command failed: {exc}"}  # fmt: skip
                rows.append({"level": lv.key, "ran": lv.key, "ok": True, "metric": value, "wall_s": round(wall, 3)})
        finally:
            arm.close()  # its server, if any, serves the arm of this environment next
        return {"ok": True, "levels": rows, "seed": seed, "device": "command", "dtype": "n/a", "reason": "",
                "what": f"the command exited 0 and printed its metric at {len(rows)} level(s); checking its results "
                        "is the command's own business"}  # fmt: skip

    def close(self) -> None:
        self.servers.close()
        super().close()

    def describe(self) -> str:
        return "command"
