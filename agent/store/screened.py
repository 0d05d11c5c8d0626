"""kinv.db's screened table: a campaign screening's candidates, one row per config (the Store's part that reads and
writes it)."""

from __future__ import annotations

import json

from kinv.agent.store.state import now


class ScreenedRows:
    """The screened table's reads and writes (a part of Store: it uses the Store's connection)."""

    # ---- screened candidates (a campaign's screening) ------------------------------------
    def screen_asked(self, exp_id: int, config_hash: str, trial: int, config: str, config_json: str) -> None:
        """A screening asked for this config (again): counted; its first trial number is kept."""
        with self.db.conn:
            self.conn.execute("insert into screened (experiment, config_hash, trial, asked, status, config, config_json, "
                              "t) values (?, ?, ?, 1, 'asked', ?, ?, ?) on conflict (experiment, config_hash) do update "
                              "set asked = asked + 1", [exp_id, config_hash, trial, config, config_json, now()])  # fmt: skip

    def screen_result(self, exp_id: int, config_hash: str, status: str, gains: dict | None = None,
                      measured_on: str | None = None, reason: str | None = None, gain_ci: dict | None = None) -> None:
        """What a screened config came to: measured (its gains per level, their intervals), incumbent, pruned or
        failed."""
        js = [json.dumps(v) if v is not None else None for v in (gains, gain_ci)]
        with self.db.conn:
            self.conn.execute("update screened set status = ?, gains = ?, gain_ci = ?, measured_on = ?, reason = ?, "
                              "t = ? where experiment = ? and config_hash = ?",
                              [status, *js, measured_on, reason, now(), exp_id, config_hash])  # fmt: skip

    def screened(self, exp_id: int) -> list[dict]:
        """A screening's configs in the order first asked, with their gains, intervals and config decoded."""
        rows = self._query("select * from screened where experiment = ? order by trial", [exp_id])
        for r in rows:
            r["config_json"] = json.loads(r["config_json"])
            for k in ("gains", "gain_ci"):
                r[k] = json.loads(r[k]) if r[k] else None
        return rows
