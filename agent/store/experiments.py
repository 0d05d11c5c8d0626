"""kinv.db's measurement tables: devices, experiments, and what an experiment stores -- its samples, verdicts,
noise, measurements and profiles."""

from __future__ import annotations

import json

from kinv.agent import faults
from kinv.agent.store.state import now


class ExperimentRows:
    """The devices, experiments, samples, verdicts, noise, measurements and profiles tables' reads and writes (a
    part of Store: it uses the Store's connection)."""

    def device(self, fingerprint: dict) -> str:
        import hashlib

        stable = {k: fingerprint.get(k) for k in ("gpu", "arch", "sms", "driver", "torch", "triton", "cuda")}
        dev_id = hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()[:12]
        if self._one("devices", dev_id) is None:
            faults.point("store.insert.devices.before")
            self.db["devices"].insert(
                {"id": dev_id, "gpu": fingerprint.get("gpu", "?"), "fingerprint": json.dumps(fingerprint),
                 "first_seen": now()}, replace=True)  # fmt: skip
            faults.point("store.insert.devices.after")
        return dev_id

    def new_experiment(self, **row) -> int:
        row.setdefault("status", "running")
        row.setdefault("started", now())
        for k in ("resources", "correctness"):
            if isinstance(row.get(k), dict | list):
                row[k] = json.dumps(row[k])
        return self._insert("experiments", row)

    def update_experiment(self, exp_id: int, **values) -> None:
        for k in ("resources", "correctness"):
            if isinstance(values.get(k), dict | list):
                values[k] = json.dumps(values[k])
        self._update("experiments", exp_id, values)

    def merge_resources(self, exp_id: int, **parts) -> None:
        """Add keys to an experiment's resources (the compiled figures its arms reported, what its timing read)."""
        row = self._one("experiments", exp_id) or {}
        res = json.loads(row.get("resources") or "{}")
        res.update(parts)
        self._update("experiments", exp_id, {"resources": json.dumps(res)})

    def running_experiment(self, ws_id: str, todo: str, kind: str) -> dict | None:
        """The newest experiment of a todo still 'running' (a node killed mid-way resumes it)."""
        rows = self._rows("experiments", "workstream = ? and todo = ? and kind = ? and status = 'running'",
                          [ws_id, todo, kind], order_by="id desc")  # fmt: skip
        return rows[0] if rows else None

    def done_experiment(self, ws_id: str, todo: str, kind: str, version: int) -> dict | None:
        """The newest finished experiment of a todo in this plan version: a node re-run after a kill between its
        commit and the graph's checkpoint reuses it instead of measuring again."""
        rows = self._rows("experiments", "workstream = ? and todo = ? and kind = ? and status = 'done' and "
                          "coalesce(version, 1) = ?", [ws_id, todo, kind, version], order_by="id desc")  # fmt: skip
        return rows[0] if rows else None

    def discard_experiment(self, exp_id: int) -> None:
        """Delete an experiment that measured nothing usable (a refused confirming A/B): its samples and
        verdicts with it, in one transaction."""
        with self.db.conn:
            for table, col in (("samples", "experiment"), ("verdicts", "experiment"), ("experiments", "id")):
                self.db.execute(f"delete from {table} where {col} = ?", [exp_id])

    def device_fingerprint(self, dev_id: str | None) -> dict:
        """The fingerprint recorded for a device id ({} when unknown)."""
        row = self._one("devices", dev_id) if dev_id else None
        return json.loads(row["fingerprint"]) if row and row.get("fingerprint") else {}

    def experiment(self, exp_id: int) -> dict | None:
        return self._one("experiments", exp_id)

    def experiments(self, ws_id: str | None = None) -> list[dict]:
        if ws_id is None:
            return self._rows("experiments", order_by="id")
        return self._rows("experiments", "workstream = ?", [ws_id], order_by="id")

    def add_samples(self, rows: list[dict]) -> None:
        """Insert samples in one transaction (all or none)."""
        rows = [{**r, "env": json.dumps(r["env"]) if isinstance(r.get("env"), dict) else r.get("env")} for r in rows]
        faults.point("store.samples.before")
        with self.db.conn:
            self.db["samples"].insert_all(rows)
        faults.point("store.samples.after")

    def places(self, exp_ids: list[int]) -> dict[str, list[str]]:
        """Which place (a Ray actor's GPU) timed which levels of these experiments: place -> levels, in the
        order first timed.  Empty when every sample was timed in one process."""
        if not exp_ids:
            return {}
        marks = ",".join("?" * len(exp_ids))
        rows = self._query(f"select place, level, min(id) as first from samples where experiment in ({marks}) "
                           "and place is not null group by place, level order by first", list(exp_ids))  # fmt: skip
        out: dict[str, list[str]] = {}
        for r in rows:
            out.setdefault(r["place"], []).append(r["level"])
        return out

    def samples(self, exp_id: int) -> list[dict]:
        return self._rows("samples", "experiment = ?", [exp_id], order_by="id")

    def sample_count(self, exp_id: int | None = None) -> int:
        if exp_id is None:
            return self.conn.execute("select count(*) from samples").fetchone()[0]
        return self.conn.execute("select count(*) from samples where experiment = ?", [exp_id]).fetchone()[0]

    def add_verdicts(self, exp_id: int, rows: list[dict]) -> None:
        faults.point("store.verdicts.before")
        with self.db.conn:
            self.db.execute("delete from verdicts where experiment = ?", [exp_id])
            self.db["verdicts"].insert_all([{**r, "experiment": exp_id, "t": now()} for r in rows])
        faults.point("store.verdicts.after")

    def add_profile(self, ws_id: str | None, exp_id: int, arm: str, config_hash: str, level: str, figures: dict,
                    source: str, seconds: float) -> None:  # fmt: skip
        with self.db.conn:
            self.db.execute("delete from profiles where experiment = ? and arm = ? and level = ?", [exp_id, arm, level])
            self.db["profiles"].insert({"workstream": ws_id, "experiment": exp_id, "arm": arm, "config_hash": config_hash,
                                        "level": level, "figures": json.dumps(figures), "source": source,
                                        "seconds": seconds, "t": now()})  # fmt: skip

    def profiles(self, ws_id: str | None = None, exp_id: int | None = None) -> list[dict]:
        rows = self._filtered("profiles", "id", workstream=ws_id, experiment=exp_id)
        return [{**r, "figures": json.loads(r["figures"] or "{}")} for r in rows]

    def verdicts(self, exp_id: int) -> list[dict]:
        return self._rows("verdicts", "experiment = ?", [exp_id], order_by="id")

    def add_noise(self, exp_id: int, ws_id: str | None, rows: list[dict]) -> None:
        faults.point("store.noise.before")
        with self.db.conn:
            self.db.execute("delete from noise where experiment = ?", [exp_id])
            self.db["noise"].insert_all([{**r, "experiment": exp_id, "workstream": ws_id, "t": now()} for r in rows])
        faults.point("store.noise.after")

    def noise(self, ws_id: str | None = None, exp_id: int | None = None) -> list[dict]:
        return self._filtered("noise", "id", experiment=exp_id, workstream=None if exp_id is not None else ws_id)

    def add_measurements(self, exp_id: int, rows: list[dict]) -> None:
        faults.point("store.measurements.before")
        with self.db.conn:
            self.db["measurements"].insert_all([{**r, "experiment": exp_id, "t": now()} for r in rows])
        faults.point("store.measurements.after")

    def measurements(self, exp_id: int) -> list[dict]:
        return self._rows("measurements", "experiment = ?", [exp_id], order_by="id")
