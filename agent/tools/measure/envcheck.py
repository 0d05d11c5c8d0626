"""The environment a plan expects vs what a worker or a live process really has.

No measurement is taken under an environment the env check did not confirm:
a worker reports ``os.environ`` as it saw it (``hello`` request), a live
process is read from ``/proc/PID/environ`` (its environment at exec time).
Every check is recorded in the store, pass or fail; only the expected
variables are stored, never a process's whole environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kinv.agent.errors import EnvMismatch
from kinv.agent.tools.backends.environ import proc_environ
from kinv.kernels.errors import BadInput

if TYPE_CHECKING:
    from kinv.agent.store.db import Store


@dataclass(frozen=True)
class Mismatch:
    var: str
    expected: str
    seen: str | None

    def describe(self, who: str) -> str:
        seen = "unset" if self.seen is None else repr(self.seen)
        return f"{self.var} expected {self.expected!r}, {who} saw {seen}"


def compare(expected: dict[str, str], seen: dict[str, str | None]) -> list[Mismatch]:
    """The expected variables whose seen value differs (a missing or None value is 'unset')."""
    return [Mismatch(var, want, seen.get(var)) for var, want in expected.items() if seen.get(var) != want]


def invalid_values(env: dict[str, str | None], adapter) -> list[str]:
    """What no run of ``adapter``'s kernel could use in ``env``, one phrase each: the rule a plan's environment
    follows (:meth:`KernelAdapter.invalid_env`), applied to a shell's or a process's values."""
    return list(adapter.invalid_env(env))


def _check(store: Store, ws_id: str | None, experiment: int | None, source: str, who: str,
           expected: dict[str, str], seen: dict[str, str | None], data: dict | None = None) -> dict:  # fmt: skip
    for var, value in expected.items():
        if not isinstance(value, str):
            raise BadInput(f"expected value of {var} is {value!r}; environment values are strings, e.g. '512'")
    mismatches = compare(expected, seen)
    shown = {var: seen.get(var) for var in expected}
    text = "; ".join(m.describe(who) for m in mismatches)
    check_id = store.add_env_check(workstream=ws_id, experiment=experiment, source=source, expected=dict(expected),
                                   seen=shown, ok=int(not mismatches), mismatch=text or None)  # fmt: skip
    event = {"check": check_id, "source": source, "seen": shown, **(data or {})}
    if mismatches:
        store.event(ws_id, "env.mismatch", f"env check failed: {text}", event)
        raise EnvMismatch(f"env check failed: {text}", mismatches)
    store.event(ws_id, "env.ok", f"env check passed ({source}): {', '.join(expected) or 'nothing expected'}", event)
    return next(r for r in store.env_checks() if r["id"] == check_id)


def check_worker(store: Store, ws_id: str | None, experiment: int | None, expected: dict[str, str],
                 seen: dict[str, str | None], derived: dict | None = None) -> dict:  # fmt: skip
    """Check the env a worker reported; records the check (``derived`` values go into its event).

    Returns the recorded check, or raises EnvMismatch naming every differing variable.
    """
    return _check(store, ws_id, experiment, "worker", "worker", expected, seen, {"derived": derived or {}})


def check_pid(store: Store, ws_id: str | None, pid: int, expected: dict[str, str],
              experiment: int | None = None, seen: dict[str, str] | None = None) -> dict:  # fmt: skip
    """Check the env of the live process ``pid`` (``seen``: its environment, read already); records the
    check; raises EnvMismatch or BadInput."""
    seen = proc_environ(pid) if seen is None else seen
    return _check(store, ws_id, experiment, f"pid:{pid}", f"pid {pid}", expected, seen)


__all__ = ["Mismatch", "check_pid", "check_worker", "compare"]
