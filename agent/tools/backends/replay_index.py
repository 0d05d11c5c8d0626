"""The index of recorded samples the replay backend serves (benchmarks/record.py writes them)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from kinv.agent.errors import BackendError, NoRecording
from kinv.agent.tools.backends.base import RECORDINGS
from kinv.kernels.launch_config import config_hash, describe


def _checked(f: Path, header: dict) -> dict:
    if header.get("version", 1) < 2:
        raise BackendError(f"{f} is a version-1 recording (one fixed allocation per worker, "
                           "rounds wrapped around); re-record it with benchmarks/record.py")
    return header


_LOADED: dict[tuple, Recording] = {}  # (files with their size and mtime, kernel) -> its parsed Recording


class Recording:
    """All recorded samples of one directory (benchmarks/record.py), indexed by slot and level.

    A slot is ``(kind, pair, role)``: ``("ab", <variant config hash>, "base" | "variant")`` for the two
    workers of one variant's A/B (each variant has a baseline worker of its own), ``("aa", "aa", "A<j>")``
    for arm j of the A/A, and ``("sw", <config hash>, "R<j>")`` for worker j of a config in a campaign
    sweep (benchmarks/record.py --sweep: every config of the space timed in every round, so any two form a
    pair).  A pair recorded as such is served from its own file; any other pair of sweep configs from the
    sweep, base from R0 and variant from R1, so both sides of a pair always come from one recording session.  A cell maps recorded round -> sample row.  Each file records one kernel (its
    header says which); a Recording serves one kernel, :meth:`for_kernel` picks it.
    """

    def __init__(self, files: list[Path], kernel: str | None = None):
        self.files = files
        self.headers: list[dict] = []
        self.cells: dict[tuple[str, str, str, str], dict[int, dict]] = {}
        self.configs: dict[str, dict] = {}
        self.kernels: set[str] = set()
        # the configs of each sweep session (file), oldest first: a pair is served from one session only
        self.sweeps: list[set[str]] = []
        sweep_ix: int | None = None
        for f in files:
            with gzip.open(f, "rt") as fh:
                header = None
                for line in fh:
                    row = json.loads(line)
                    kind = row.get("type")
                    if kind == "header":
                        header = _checked(f, row)
                        self.kernels.add(row.get("kernel", ""))
                        if kernel is not None and row.get("kernel") != kernel:
                            break  # another kernel's recording
                        self.headers.append(row)
                        for cfg in row.get("configs", {}).values():
                            self.configs[config_hash(cfg)] = cfg
                        sweep_ix = None
                        if row.get("sweep"):
                            sweep_ix = len(self.sweeps)
                            self.sweeps.append(set())
                    elif kind == "sample" and header is not None:
                        pair = row["pair"]
                        if row["kind"] == "sw" and sweep_ix is not None:
                            # one config may be in several sweeps: its workers are kept apart per session
                            self.sweeps[sweep_ix].add(pair)
                            pair = f"{pair}@{sweep_ix}"
                        key = (row["kind"], pair, row["role"], row["level"])
                        self.cells.setdefault(key, {})[row["round"]] = row
        if not self.headers:
            if kernel is not None and self.kernels:
                raise NoRecording(f"replay has no recording of kernel {kernel!r}; recorded kernels: "
                                  f"{', '.join(sorted(self.kernels))} (record it on a GPU: benchmarks/record.py)")
            raise BackendError(f"no recordings found in {', '.join(map(str, files)) or RECORDINGS}")

    @classmethod
    def load(cls, files: list[Path], kernel: str | None = None) -> Recording:
        """The Recording of ``files`` (for ``kernel``), parsed once per process while no file changes: a
        process that opens replay backends often (an MCP server, a test's in-process commands) parses each
        recording once, and a recording re-written in place (same path, new size or mtime) is parsed anew."""
        stamp = []
        for f in files:
            st = Path(f).stat()
            stamp.append((str(f), st.st_size, st.st_mtime_ns))
        key = (tuple(stamp), kernel)
        if key not in _LOADED:
            _LOADED[key] = cls(files, kernel)
        return _LOADED[key]

    @staticmethod
    def first_header(files: list[Path]) -> dict:
        """The header of the first recording (its GPU, versions and copy bandwidth) without reading the samples."""
        for f in files:
            with gzip.open(f, "rt") as fh:
                row = json.loads(fh.readline() or "{}")
            if row.get("type") == "header":
                return _checked(f, row)
        raise BackendError(f"no recordings found in {', '.join(map(str, files)) or RECORDINGS}")

    @property
    def fingerprint(self) -> dict:
        return self.headers[0]["fingerprint"]

    def in_sweep(self, chash: str) -> bool:
        return any(chash in hashes for hashes in self.sweeps)

    def _session(self, chash: str, partner_hash: str | None) -> int | None:
        """The sweep session that serves ``chash`` (with ``partner_hash``, one that holds both): the oldest
        such, so a newer recording never changes which workers serve a pair an older one already served."""
        order = sorted(range(len(self.sweeps)), key=lambda i: self._sweep_created(i))
        for i in order:
            if chash in self.sweeps[i] and (partner_hash is None or partner_hash in self.sweeps[i]):
                return i
        return None

    def _sweep_created(self, i: int) -> float:
        sweeps = [h for h in self.headers if h.get("sweep")]
        return float(sweeps[i].get("created") or 0.0)

    @property
    def slots(self) -> set[tuple[str, str, str]]:
        if not hasattr(self, "_slots"):
            self._slots = {k[:3] for k in self.cells}
        return self._slots

    def sweep_slot(self, chash: str, partner_hash: str | None, replica: int | None, role: str):
        """The sweep worker that serves this arm, or None when the sweep does not cover it."""
        i = self._session(chash, partner_hash)
        if i is None:
            return None
        j = replica if replica is not None else (1 if role == "variant" and partner_hash is not None else 0)
        slot = ("sw", f"{chash}@{i}", f"R{j}")
        if slot not in self.slots:
            have = sorted(k[2] for k in self.slots if k[:2] == ("sw", f"{chash}@{i}"))
            raise NoRecording(f"replay has {len(have)} sweep workers of {describe(self.configs[chash])}; worker "
                              f"{j} was asked for (lower stats.aa_arms to {len(have)})")  # fmt: skip
        return slot

    def slot_for(self, chash: str, partner_hash: str | None, replica: int | None,
                 role: str = "variant", partner_cfg: dict | None = None) -> tuple[str, str, str]:
        """The recorded slot that serves an arm of config ``chash``; NoRecording names what exists (the
        partner by its label: ``partner_cfg`` when the recording does not hold it)."""
        try:
            return self._pair_slot(chash, partner_hash, replica, role, partner_cfg)
        except NoRecording:
            slot = self.sweep_slot(chash, partner_hash, replica, role)
            if slot is None:
                raise
            return slot

    def _pair_slot(self, chash, partner_hash, replica, role, partner_cfg=None) -> tuple[str, str, str]:
        if partner_hash is None and replica is None and self.in_sweep(chash):
            return self.sweep_slot(chash, None, None, role)  # a lone arm (kinv bench, a screening): a sweep's worker
        if chash not in self.configs:
            known = ", ".join(f"{describe(c)} ({h})" for h, c in sorted(self.configs.items()))
            raise NoRecording(f"replay has no recording of config {chash}; recorded configs: {known}")
        if replica is not None:
            slot = ("aa", "aa", f"A{replica}")
            if not any(k[:3] == slot for k in self.cells):
                arms = sorted({k[2] for k in self.cells if k[0] == "aa"})
                raise NoRecording(f"replay has no A/A arm {replica}; recorded A/A arms: {', '.join(arms) or 'none'} "
                                  "(lower stats.aa_arms)")
            return slot
        if partner_hash is not None and partner_hash == chash and self._aa_hash() == chash:
            # the same config on both sides (a source-only variant): two independent workers of it, the A/A's
            return ("aa", "aa", "A0" if role == "base" else "A1")
        if partner_hash is not None:
            # a recorded A/B serves a pair only where each of its workers ran the config asked for: its base worker
            # ran the recording's baseline, never the variant (a config against itself is two workers of it: the
            # A/A's above, else a sweep's)
            if role == "variant" and self._ran(("ab", chash, "variant"), chash):
                return ("ab", chash, "variant")
            if role == "base" and self._ran(("ab", partner_hash, "base"), chash):
                return ("ab", partner_hash, "base")
            pairs = ", ".join(describe(self.configs[k[1]]) for k in sorted({k[:3] for k in self.cells})
                              if k[0] == "ab" and k[2] == "variant" and k[1] in self.configs)
            other = self.configs.get(partner_hash) or partner_cfg
            raise NoRecording(f"replay has no A/B of {describe(self.configs[chash])} against "
                              f"{describe(other) if other else 'config ' + partner_hash}"
                              f"; recorded A/B variants: {pairs}")
        # a lone arm (kinv bench): the config's own variant worker, else A/A arm 0
        for slot in (("ab", chash, "variant"), ("aa", "aa", "A0")):
            if slot in {k[:3] for k in self.cells} and (slot[0] == "ab" or self._aa_hash() == chash):
                return slot
        raise NoRecording(f"replay has no lone recording of {describe(self.configs[chash])}")

    def _ran(self, slot: tuple[str, str, str], chash: str) -> bool:
        """Whether the recorded worker of ``slot`` ran config ``chash`` (its samples say which config they timed)."""
        cell = next((c for k, c in self.cells.items() if k[:3] == slot), None)
        return bool(cell) and next(iter(cell.values())).get("config_hash") == chash

    def _aa_hash(self) -> str | None:
        row = next((c for k, c in self.cells.items() if k[0] == "aa"), None)
        return next(iter(row.values()))["config_hash"] if row else None

    def levels(self, slot: tuple[str, str, str]) -> list[str]:
        return sorted({k[3] for k in self.cells if k[:3] == slot})

    def cell(self, slot: tuple[str, str, str], level_key: str) -> dict[int, dict]:
        cell = self.cells.get((*slot, level_key))
        if cell:
            return cell
        raise NoRecording(f"replay has no recording at {level_key}; recorded levels: {', '.join(self.levels(slot))}")
