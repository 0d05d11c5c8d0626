"""kinv.db's screened table: a campaign screening's candidates, one row per config, and :class:`Screened`, the one
shape a screened candidate has from the shard that timed it (agent/tools/runners/screening.py) through this table to the
campaign's steps and views."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict

from kinv.agent.store.state import now


class Screened(BaseModel):
    """One candidate of a screening: what the shard measured, the screened table's row, what the steps read.

    ``status``: asked (not yet answered), measured (``gains``: its throughput change over the incumbent at every
    level, ``gain_ci`` their intervals, none after one round; ``measured_on``: where), incumbent (the incumbent
    itself: no change), pruned or failed (``reason``)."""

    model_config = ConfigDict(extra="ignore")

    config_hash: str
    status: Literal["asked", "measured", "incumbent", "pruned", "failed"] = "asked"
    trial: int | None = None  # the first trial that asked for it
    asked: int = 1  # how many times the search asked for it
    config: str | None = None
    config_json: dict | None = None
    gains: dict[str, float] | None = None
    gain_ci: dict[str, list[float | None]] | None = None
    measured_on: str | None = None
    reason: str | None = None

    def __getitem__(self, column: str):
        """A field read as kinv.db's column of the same name (``row["gains"]``)."""
        return getattr(self, column)


class ScreenedRows:
    """The screened table's reads and writes (a part of Store: it uses the Store's connection)."""

    # ---- screened candidates (a campaign's screening) ------------------------------------
    def screen_asked(self, exp_id: int, config_hash: str, trial: int, config: str, config_json: str) -> None:
        """A screening asked for this config (again): counted; its first trial number is kept."""
        with self.db.conn:
            self.conn.execute("insert into screened (experiment, config_hash, trial, asked, status, config, config_json, "
                              "t) values (?, ?, ?, 1, 'asked', ?, ?, ?) on conflict (experiment, config_hash) do update "
                              "set asked = asked + 1", [exp_id, config_hash, trial, config, config_json, now()])  # fmt: skip

    def screen_result(self, exp_id: int, result: Screened | str, status: str | None = None, **fields) -> None:
        """What a screened config came to: a :class:`Screened` (measured: its gains per level and their intervals;
        incumbent; pruned or failed: the reason), or its config hash, status and those fields."""
        s = result if isinstance(result, Screened) else Screened(config_hash=result, status=status, **fields)
        js = [json.dumps(v) if v is not None else None for v in (s.gains, s.gain_ci)]
        with self.db.conn:
            self.conn.execute("update screened set status = ?, gains = ?, gain_ci = ?, measured_on = ?, reason = ?, "
                              "t = ? where experiment = ? and config_hash = ?",
                              [s.status, *js, s.measured_on, s.reason, now(), exp_id, s.config_hash])  # fmt: skip

    def screened(self, exp_id: int) -> list[Screened]:
        """A screening's configs in the order first asked."""
        rows = self._query("select * from screened where experiment = ? order by trial", [exp_id])
        for r in rows:
            r["config_json"] = json.loads(r["config_json"])
            for k in ("gains", "gain_ci"):
                r[k] = json.loads(r[k]) if r[k] else None
        return [Screened(**r) for r in rows]
