"""kinv.db's campaigns table, and the sums a campaign's ledger and wall clock read across its workstreams."""

from __future__ import annotations

import json

from kinv.agent.store.state import now


class CampaignRows:
    """The campaigns table's reads and writes, and the ledger and wall-time sums over a campaign's experiments and
    workstreams (a part of Store: it uses the Store's connection)."""

    _CAMPAIGN_JSON = ("start_config", "incumbent", "steps", "summary")

    def upsert_campaign(self, row: dict) -> None:
        row = {k: json.dumps(v) if k in self._CAMPAIGN_JSON and not isinstance(v, str) else v for k, v in row.items()}
        row["updated"] = now()
        if self._one("campaigns", row["id"]) is None:
            self._insert("campaigns", {"created": now(), **row})
        else:
            self._update("campaigns", row["id"], row)

    def campaign(self, campaign_id: str) -> dict | None:
        row = self._one("campaigns", campaign_id)
        if row is None:
            return None
        return {k: json.loads(v) if k in self._CAMPAIGN_JSON and v else v for k, v in row.items()}

    def campaigns(self) -> list[dict]:
        return [self.campaign(r["id"]) for r in self._rows("campaigns", order_by="created")]

    def ledger_sums(self, experiments: list[int], workstreams: list[str]) -> tuple[float, int, float, int]:
        """kinv.db's side of the GPU-second ledger (agent.tools.protocol.Ledger) of these experiments, or of every
        experiment of these workstreams (screening included): the stored samples' GPU s and count, and the GPU s
        and count of the lost samples' events (a level of a round that lost a sample: nothing of it is stored)."""
        if not experiments and not workstreams:
            return 0.0, 0, 0.0, 0
        marks = ",".join("?" * (len(experiments) or len(workstreams)))
        which = (f"e.id in ({marks})" if experiments else f"e.workstream in ({marks})")
        args = experiments or workstreams
        if experiments:  # summed here in the order stored, as each experiment's own ledger always was
            got = [r[0] for r in self.conn.execute(f"select gpu_s from samples where experiment in ({marks}) order by "
                                                   "experiment, id", args)]  # fmt: skip
            kept = (sum(g or 0.0 for g in got), len(got))
        else:
            kept = self.conn.execute(f"select coalesce(sum(s.gpu_s), 0), count(*) from samples s join experiments e "
                                     f"on s.experiment = e.id where {which}", args).fetchone()  # fmt: skip
        lost = self.conn.execute(f"select coalesce(sum(json_extract(v.data, '$.gpu_s')), 0), count(*) from events v "
                                 f"join experiments e on json_extract(v.data, '$.experiment') = e.id where "
                                 f"v.kind = 'sample.lost' and {which}", args).fetchone()  # fmt: skip
        return float(kept[0]), int(kept[1]), float(lost[0]), int(lost[1])

    def campaign_wall_s(self, ws_ids: list[str]) -> float:
        """Wall seconds these workstreams spent running: their screenings (a running one until now) and their graph
        nodes (node_runs, which end where a node pauses for a person), never the time paused between them."""
        if not ws_ids:
            return 0.0
        marks = ",".join("?" * len(ws_ids))
        nodes = self.conn.execute(f"select coalesce(sum(finished - started), 0) from node_runs where workstream in "
                                  f"({marks})", ws_ids).fetchone()[0]  # fmt: skip
        screens = self.conn.execute(f"select coalesce(sum(coalesce(finished, ?) - started), 0) from experiments where "
                                    f"kind = 'screen' and workstream in ({marks})", [now(), *ws_ids]).fetchone()[0]  # fmt: skip
        return float(nodes) + float(screens)
