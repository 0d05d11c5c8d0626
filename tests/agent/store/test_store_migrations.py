"""Migrations are one transaction under the database's write lock."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from kinv.agent import store as store_mod
from kinv.agent.errors import StoreError
from kinv.agent.store.db import Store


def test_a_failure_midway_through_the_first_open_leaves_nothing_and_the_next_open_works(tmp_path, monkeypatch):
    def disk_full(db):
        raise sqlite3.OperationalError("database or disk is full")

    # the first migration creates every table, then the disk fills: the open fails
    monkeypatch.setattr(store_mod.schema, "MIGRATIONS", [store_mod.schema.MIGRATIONS[0], ("m_full", disk_full)])
    with pytest.raises(StoreError, match="disk is full"):  # one line naming the state dir, not SQLite
        Store(tmp_path / "state")
    conn = sqlite3.connect(tmp_path / "state" / "kinv.db")
    tables = {r[0] for r in conn.execute("select name from sqlite_master where type = 'table'")}
    conn.close()
    assert not tables & {"workstreams", "experiments", "_migrations"}, tables  # rolled back whole
    monkeypatch.undo()
    s = Store(tmp_path / "state")  # not "table workstreams already exists"
    assert {n for n, _ in store_mod.schema.MIGRATIONS} == {r[0] for r in s.conn.execute("select name from _migrations")}


def test_two_first_opens_of_a_fresh_state_dir_take_turns(tmp_path):
    errors, stores = [], []

    def open_it():
        try:
            stores.append(Store(tmp_path / "state"))
        except Exception as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    names = [r[0] for r in stores[0].conn.execute("select name from _migrations")]
    assert len(names) == len(set(names)) == len(store_mod.schema.MIGRATIONS)
