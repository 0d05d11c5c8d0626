"""Any command as the thing under investigation: a benchmark script, a serving benchmark's client, anything that
prints a metric.  ``kernel: command`` in a plan; measured by the command backend (agent/tools/backends/command.py).

The plan's ``workload`` says how to run it and what it prints::

    workload:
      command: ["{python}", "examples/cpu_matmul.py", "--n", "{n}"]   # argv; {dim} from the level, {python}
      metric: {json_key: gflops, unit: GFLOP/s, higher_is_better: true}   # or regex: 'tokens/s: ([0-9.]+)'
      timeout_s: 60
      levels: [{n: 256}, {n: 512}]

With ``server:`` (its ``command``, a ``ready_url`` polled until it answers 200, ``restart: never | round``) each arm
has a long-lived server started in the arm's environment, and ``command`` is the client, run once per sample with
the server's ``{port}``.

A variant changes what the command's process sees: ``env: {OMP_NUM_THREADS: "1"}``, or its arguments: the workload's
``args: {block: "64"}`` names ``{block}`` placeholders of the command and their values in the baseline's runs, and a
variant's ``args: {block: "128"}`` fills them in its own runs (a backlog item's ``args: {block: ["128", "256"]}`` is
searched by a campaign as environment values are).  An arm's arguments reach its runs through its environment
(``KINV_ARG_<name>``, so the env check confirms them in the very process measured).  The command has no tunables
of kinv's: its config file holds only ``{"kernel": "command"}``.  The "correctness check" is that the command
exits 0 and prints its metric at every level; checking its results is the command's own business.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from kinv.kernels.adapter import KernelAdapter, Level, Resources
from kinv.kernels.errors import BadInput
from kinv.kernels.tunables import TunableSpec


class _CommandSpec(TunableSpec):
    def label(self, values: Mapping[str, int]) -> str:
        return "the command"


SPEC = _CommandSpec(kernel="command", tunables=())
SCALE_US = {"s": 1e6, "ms": 1e3, "us": 1.0}
RUN = "_run"  # the level's dimension that carries how to run it (never part of its key or label)
ARG_ENV = "KINV_ARG_"  # an arm's command argument {name} travels in its environment as KINV_ARG_<name>
RESERVED = ("python", "port")


def args_of(env: Mapping[str, str] | None) -> dict[str, str]:
    """The command arguments an arm's environment carries (``KINV_ARG_<name>`` -> ``{name: value}``)."""
    return {k[len(ARG_ENV):]: str(v) for k, v in (env or {}).items() if k.startswith(ARG_ENV)}


def _workload_model():
    from typing import Literal

    from pydantic import BaseModel, ConfigDict, Field, model_validator

    class Metric(BaseModel):
        model_config = ConfigDict(extra="forbid")
        json_key: str | None = Field(None, description="the key of the metric in the JSON object the command "
                                     "prints last (dots for nesting: 'result.tokens_per_s')")
        regex: str | None = Field(None, description="a regular expression whose first group is the metric")
        unit: str = Field("units", max_length=32, description="what the metric is in, e.g. 'tok/s' or 'ms'")
        higher_is_better: bool = True
        scale: Literal["s", "ms", "us"] | None = Field(None, description="a time metric's unit (lower is better)")
        also: list[str] = Field(default_factory=list, max_length=8, description="other keys of the same JSON "
                                "object to keep per sample and show per arm in the close-out (e.g. a part's time "
                                "or its share of the whole); never decided on")

        @model_validator(mode="after")
        def _one(self):
            if (self.json_key is None) == (self.regex is None):
                raise ValueError("give exactly one of json_key and regex")
            if self.also and self.json_key is None:
                raise ValueError("also: needs json_key (the other keys are read from the same JSON object)")
            if self.regex is not None:
                import re

                try:
                    if re.compile(self.regex).groups < 1:
                        raise ValueError(f"regex {self.regex!r} has no group: put the metric in (...)")
                except re.error as exc:
                    raise ValueError(f"regex {self.regex!r} is invalid: {exc}") from None
            return self

    class Server(BaseModel):
        model_config = ConfigDict(extra="forbid")
        command: list[str] = Field(min_length=1, description="argv of the long-lived server of an arm, started "
                                   "in the arm's environment; '{port}' is a free port kinv picks, '{python}' this "
                                   "Python")
        ready_url: str = Field("http://127.0.0.1:{port}/ready", description="polled until it answers 200")
        ready_timeout_s: float = Field(300.0, gt=0, le=3600)
        restart: Literal["never", "round"] = Field("never", description="'round': a fresh server before each round")

        @model_validator(mode="after")
        def _parts(self):
            for part in [*self.command, self.ready_url]:
                try:
                    part.format(python="python", port=0)
                except (KeyError, IndexError, ValueError) as exc:
                    raise ValueError(f"server part {part!r}: {exc!r} is not one of {{python}}, {{port}}") from None
            if not self.ready_url.startswith(("http://", "https://")):
                raise ValueError(f"ready_url {self.ready_url!r} must be an http:// URL")
            return self

    class CommandWorkload(BaseModel):
        model_config = ConfigDict(extra="forbid")
        command: list[str] = Field(min_length=1, description="argv; '{dim}' is replaced by the level's value, "
                                   "'{python}' by this Python, '{port}' by the arm's server's port (with "
                                   "'server'), '{{' and '}}' are literal braces")
        server: Server | None = Field(None, description="a long-lived server per arm; 'command' is then the "
                                      "client run once per sample")
        metric: Metric
        timeout_s: float = Field(120.0, gt=0, le=3600)
        warmup: int = Field(1, ge=0, le=10, description="unrecorded runs of each arm at each level first")
        args: dict[str, str] = Field(default_factory=dict, description="the command's '{name}' placeholders that "
                                     "are arguments, not level dimensions, with their values in the baseline's runs "
                                     "(e.g. {block: '64'}); a variant's args: replaces them in its runs")
        levels: list[dict[str, int | str]] = Field(min_length=1, max_length=16, description="the levels: each a "
                                                   "mapping of the command's '{dim}' placeholders to values")

        @model_validator(mode="after")
        def _levels(self):
            keys = {tuple(sorted(lv)) for lv in self.levels}
            if len(keys) != 1:
                raise ValueError("every level must name the same dimensions")
            if len({tuple(sorted(lv.items())) for lv in self.levels}) != len(self.levels):
                raise ValueError("levels must be distinct")
            import re

            for name in self.args:
                if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,40}", name) or name in RESERVED:
                    raise ValueError(f"args: {name!r} is not an argument name (letters, digits, _; not "
                                     f"{' or '.join(RESERVED)})")  # fmt: skip
                if name in self.levels[0]:
                    raise ValueError(f"args: {name!r} is also a level dimension; give it in one place")
            for part in self.command:
                for lv in self.levels:
                    try:
                        part.format(python="python", **({"port": 0} if self.server else {}), **self.args, **lv)
                    except (KeyError, IndexError, ValueError) as exc:
                        raise ValueError(f"command part {part!r}: {exc!r} is not a level dimension or an argument "
                                         f"(dimensions: {', '.join(sorted(lv))}; args: "
                                         f"{', '.join(sorted(self.args)) or 'none'})") from None  # fmt: skip
            return self

    return CommandWorkload


class CommandAdapter(KernelAdapter):
    name = "command"
    spec = SPEC
    throughput_unit = "the plan's metric"
    resource_model = False
    shows_time = False
    example_plan = "plans/cpu-matmul-threads.yaml"

    def config_path(self) -> Path:
        """``command.json`` in the live config dir: only ``{"kernel": "command"}`` (kinv's bookkeeping for a
        workload without kinv tunables)."""
        d = os.environ.get("KINV_CONFIG_DIR")
        return Path(d) / "command.json" if d else Path(__file__).resolve().parent / "configs" / "command.json"

    def ensure_config(self) -> Path:
        """:meth:`config_path`, written with ``{"kernel": "command"}`` when missing."""
        path = self.config_path()
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text('{\n  "kernel": "command"\n}\n')
        return path

    def workload_model(self):
        return _workload_model()

    def levels(self, workload) -> list[Level]:
        run = {"command": list(workload.command), "metric": workload.metric.model_dump(),
               "timeout_s": workload.timeout_s, "warmup": workload.warmup, "args": dict(workload.args),
               "server": workload.server.model_dump() if workload.server else None}  # fmt: skip
        self.throughput_unit = workload.metric.unit
        return [self.level({**lv, RUN: run}) for lv in workload.levels]

    def level(self, dims: Mapping) -> Level:
        if not isinstance(dims, Mapping) or RUN not in dims:
            raise ValueError(f"a command level carries how to run it ({RUN}); got {sorted(dims or {})}")
        return Level(dims, self.level_key(dims), self.level_label(dims))

    def level_key(self, dims: Mapping) -> str:
        return "/".join(f"{k}{v}" for k, v in dims.items() if k != RUN)

    def level_label(self, dims: Mapping) -> str:
        return self.level_key(dims)

    # ---- what the command backend runs and reads ---------------------------------------
    @staticmethod
    def argv(level: Level, port: int | None = None, env: Mapping[str, str] | None = None,
             placeholder_port: bool = False) -> list[str]:  # fmt: skip
        """The argv of one run at ``level`` in an arm's environment ``env`` (its arguments: the workload's
        ``args``, with the arm's own ``KINV_ARG_<name>`` values on top), the client's with the arm's server's
        ``port`` (``placeholder_port``: ``{port}`` left as written, for a person to read)."""
        import sys

        dims = {k: v for k, v in level.dims.items() if k != RUN}
        extra = {"port": port} if port is not None else {"port": "{port}"} if placeholder_port else {}
        args = {**level.dims[RUN].get("args", {}), **args_of(env)}
        return [p.format(python=sys.executable, **extra, **args, **dims) for p in level.dims[RUN]["command"]]

    @staticmethod
    def arg_names(level: Level) -> list[str]:
        """The argument names the command's placeholders take (the workload's ``args``)."""
        return sorted(level.dims[RUN].get("args", {}))

    @staticmethod
    def server(level: Level) -> dict | None:
        """The plan's server (its argv and readiness probe still holding ``{port}``), or None."""
        return level.dims[RUN].get("server")

    def time_us(self, level: Level, metric: float) -> float:
        """The time kinv's statistics compare for one run's metric: the metric itself for a time (``scale``), its
        reciprocal for a higher-is-better rate (so a throughput change is ``expm1(effect)``), else the metric."""
        m = level.dims[RUN]["metric"]
        if m.get("scale"):
            return metric * SCALE_US[m["scale"]]
        return 1e6 / metric if m.get("higher_is_better", True) else metric

    def throughput(self, level: Level, us: float) -> float:
        """The metric back from :meth:`time_us`'s time (its inverse)."""
        m = level.dims[RUN]["metric"]
        if m.get("scale"):
            return us / SCALE_US[m["scale"]]
        return 1e6 / us if m.get("higher_is_better", True) else us

    # ---- an in-process launch does not exist ----------------------------------------
    def make_inputs(self, level: Level, seed: int, device: str = "cuda", dtype=None, vary_lengths: bool = False):
        raise BadInput("a command is measured by running it: use --backend command")

    def launch(self, inputs: dict, params, out=None, scratch=None, **mode):
        raise BadInput("a command is measured by running it: use --backend command")

    def reference(self, inputs: dict):
        raise BadInput("a command is measured by running it: use --backend command")

    def bytes_moved(self, level: Level) -> int:
        return 0

    def flops(self, level: Level) -> int:
        return 0

    def roofline(self, level, copy_gbps, matrix_tflops):
        return None  # a command's floor is its own business

    def resources(self, params, level: Level, device, compiled=None) -> Resources:
        return Resources(smem_estimate=0, occupancy={"ctas_per_sm": 0, "warps_per_sm": 0, "limited_by": "n/a"})
