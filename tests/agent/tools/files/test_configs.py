"""Journaled config and source patches: backup first, atomic writes, exact reverts, crash recovery."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kinv.agent.errors import PatchError, RevertError
from kinv.agent.store.db import Store
from kinv.agent.tools.files import config_text, configs
from kinv.kernels.launch_config import load_config
from tests.utils import write_seed_config

ROOT = Path(__file__).resolve().parents[4]
REAL_CONFIG = ROOT / "kernels" / "configs" / "mla_decode.json"
WS = "#3a"
SOURCE = "def f(x):\n    a = x + 1\n    b = a * 2\n    return b\n\n\ndef g():\n    return 0\n"


@pytest.fixture
def store(state_dir):
    s = Store(state_dir)
    yield s
    s.close()


@pytest.fixture
def cfg_path(tmp_path):
    p = tmp_path / "kernels" / "configs" / "mla_decode.json"
    p.parent.mkdir(parents=True)
    write_seed_config(p.parent)  # the seed's BT16/w4/s2, the file these patches were written against
    return p


@pytest.fixture
def src_path(tmp_path):
    p = tmp_path / "kern.py"
    p.write_text(SOURCE)
    return p


def base_cfg(path) -> dict:
    return json.loads(Path(path).read_text())


def test_an_edit_to_the_same_config_keeps_the_real_file_byte_for_byte_and_a_new_file_is_in_declared_order():
    text = REAL_CONFIG.read_text()
    assert config_text.edit_config_text(text, load_config(REAL_CONFIG)) == text
    shuffled = {"num_stages": 2, "BLOCK_T": 16, "kernel": "mla_decode", "num_warps": 4, "BLOCK_H": 16}
    assert list(json.loads(config_text.render_config(shuffled))) == ["kernel", "BLOCK_T", "BLOCK_H", "num_warps",
                                                                 "num_stages"]  # fmt: skip


def test_backup_is_content_addressed_and_reused(store, cfg_path, state_dir):
    b1 = configs.backup(store, cfg_path, WS)
    b2 = configs.backup(store, cfg_path, WS)
    assert b1 == b2 and len(store.backups()) == 1
    bp = Path(b1["backup_path"])
    assert bp == state_dir / "backups" / "3a" / f"mla_decode.json.{configs.sha(cfg_path)}"
    assert bp.read_bytes() == cfg_path.read_bytes()


def test_patch_config_writes_journal_and_reverts_exactly(store, cfg_path):
    before = cfg_path.read_bytes()
    new = {**base_cfg(cfg_path), "num_warps": 8}
    row = configs.patch_config(store, cfg_path, new, WS, experiment=None)
    assert row["state"] == "applied" and row["kind"] == "config"
    assert row["sha_before"] == hashlib.sha256(before).hexdigest()[:16]
    assert row["sha_after"] == configs.sha(cfg_path) != row["sha_before"]
    assert '-  "num_warps": 4,' in row["diff"] and '+  "num_warps": 8,' in row["diff"]
    assert json.loads(cfg_path.read_text())["num_warps"] == 8
    assert cfg_path.read_text().endswith("}\n")
    reverted = configs.revert(store, row["id"])
    assert reverted["state"] == "reverted"
    assert cfg_path.read_bytes() == before
    assert configs.revert(store, row["id"])["state"] == "reverted"  # idempotent
    assert store.dangling_patches() == []


def test_backup_and_intent_come_before_the_write(store, cfg_path, monkeypatch):
    before = cfg_path.read_bytes()
    seen = {}
    real_replace = os.replace

    def failing_replace(src, dst):
        if Path(dst) != cfg_path:  # the backup's own atomic write
            return real_replace(src, dst)
        # at the moment of the kernel file's write: the intent row and the backup already exist
        (row,) = store.patches()
        seen["state"], seen["sha_before"] = row["state"], row["sha_before"]
        seen["backup"] = Path(store.backups()[0]["backup_path"]).read_bytes()
        raise OSError("disk on fire")

    monkeypatch.setattr(configs.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk on fire"):
        configs.patch_config(store, cfg_path, {**base_cfg(cfg_path), "num_stages": 3}, WS)
    monkeypatch.undo()
    assert seen == {"state": "intent", "sha_before": configs.sha(cfg_path), "backup": before}
    assert cfg_path.read_bytes() == before
    assert not list(cfg_path.parent.glob(".*kinv-tmp*"))  # no temp file left behind
    assert configs.recover(store) == [] and store.dangling_patches() == []
    assert cfg_path.read_bytes() == before


def test_recover_after_a_crash_mid_patch(store, cfg_path, state_dir):
    """A process killed between the write and 'applied' leaves an intent row and a patched file."""
    before = cfg_path.read_bytes()
    script = textwrap.dedent(f"""
        import os, sys
        from kinv.agent.store.db import Store
        from kinv.agent.tools.files import configs
        from kinv.agent.tools.files import config_text
        real = os.replace
        def crash(src, dst):
            real(src, dst)
            if str(dst) == {str(cfg_path)!r}:
                os._exit(9)  # killed right after the write, before journal_set('applied')
        configs.os.replace = crash
        cfg = {{"kernel": "mla_decode", "BLOCK_T": 32, "BLOCK_H": 16, "num_warps": 8, "num_stages": 1}}
        configs.patch_config(Store({str(state_dir)!r}), {str(cfg_path)!r}, cfg, "#3a")
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 9
    assert cfg_path.read_bytes() != before
    (dangling,) = store.dangling_patches()
    assert dangling["state"] == "intent"
    (done,) = configs.recover(store)
    assert done["action"] == "restored" and done["state_was"] == "intent"
    assert cfg_path.read_bytes() == before
    assert store.dangling_patches() == [] and configs.recover(store) == []


def test_recover_restores_an_applied_patch(store, cfg_path):
    before = cfg_path.read_bytes()
    configs.patch_config(store, cfg_path, {**base_cfg(cfg_path), "BLOCK_T": 64}, WS)
    (done,) = configs.recover(store)
    assert done["action"] == "restored" and done["state_was"] == "applied"
    assert cfg_path.read_bytes() == before


@pytest.mark.parametrize(
    "change,field",
    [({"num_warps": 3}, "num_warps=3"), ({"BLOCK_T": 8}, "BLOCK_T=8"), ({"bogus": 1}, "bogus"),
     ({"kernel": "other"}, "kernel='other'")],
)  # fmt: skip
def test_invalid_config_is_refused_and_changes_nothing(store, cfg_path, change, field):
    before = cfg_path.read_bytes()
    with pytest.raises(PatchError) as err:
        configs.patch_config(store, cfg_path, {**base_cfg(cfg_path), **change}, WS)
    msg = str(err.value)
    assert field in msg and "\n" not in msg
    assert cfg_path.read_bytes() == before
    assert store.patches() == [] and store.backups() == []


def test_second_patch_of_a_patched_file_is_refused(store, cfg_path):
    row = configs.patch_config(store, cfg_path, {**base_cfg(cfg_path), "num_warps": 8}, WS)
    with pytest.raises(PatchError, match=f"un-reverted patch #{row['id']}"):
        configs.patch_config(store, cfg_path, {**base_cfg(cfg_path), "num_stages": 3}, WS)
    configs.revert(store, row["id"])


def test_revert_refuses_a_corrupt_backup(store, cfg_path):
    row = configs.patch_config(store, cfg_path, {**base_cfg(cfg_path), "num_warps": 8}, WS)
    Path(store.backups()[0]["backup_path"]).write_text("{}")
    with pytest.raises(RevertError) as err:
        configs.revert(store, row["id"])
    assert row["sha_before"] in str(err.value) and hashlib.sha256(b"{}").hexdigest()[:16] in str(err.value)
    assert store.dangling_patches()[0]["id"] == row["id"]  # still dangling: nothing claimed it was reverted


def test_config_diff_of_a_read_config(cfg_path):
    old = load_config(cfg_path, "mla_decode")
    d = config_text.config_diff(old, {**old, "num_stages": 3}, "kernels/configs/mla_decode.json")
    assert d.startswith("--- a/kernels/configs/mla_decode.json\n+++ b/kernels/configs/mla_decode.json\n")
    assert '-  "num_stages": 2\n+  "num_stages": 3\n' in d


# --------------------------------------------------------------------------- #
# source patches
# --------------------------------------------------------------------------- #
def test_source_patch_applies_and_reverts(store, src_path):
    before = src_path.read_bytes()
    new = SOURCE.replace("b = a * 2", "b = a * 3").replace("return 0", "return 1")
    diff = config_text.diff_text(SOURCE, new, "kern.py")
    row = configs.patch_source(store, src_path, diff, WS)
    assert src_path.read_text() == new
    assert row["state"] == "applied" and row["kind"] == "source" and row["diff"] == diff
    configs.revert(store, row["id"])
    assert src_path.read_bytes() == before


def test_source_patch_without_trailing_newline_and_insertions():
    old = "a\nb\nc"
    for new in ("a\nb\nc\n", "x\na\nb\nc", "a\nb\nc\nd", "a\nc", ""):
        assert config_text.apply_unified_diff(old, config_text.diff_text(old, new, "f.txt"), "f.txt") == new


def test_bad_hunk_is_refused_and_changes_nothing(store, src_path):
    before = src_path.read_bytes()
    diff = "--- a/kern.py\n+++ b/kern.py\n@@ -2,2 +2,2 @@\n     a = x + 2\n-    b = a * 2\n+    b = a * 3\n"
    with pytest.raises(PatchError, match=r"^hunk 1 does not apply at line 2 of .*kern\.py$"):
        configs.patch_source(store, src_path, diff, WS)
    second = config_text.diff_text(SOURCE, SOURCE.replace("return 0", "return 1"), "kern.py").replace(
        "return 0", "return 9"
    )
    first = "--- a/kern.py\n+++ b/kern.py\n@@ -1,1 +1,1 @@\n-def f(x):\n+def f(y):\n"
    with pytest.raises(PatchError, match="hunk 2 does not apply at line 5"):
        configs.patch_source(store, src_path, first + second.split("\n", 2)[2], WS)
    assert src_path.read_bytes() == before
    assert store.patches() == [] and store.backups() == []


@pytest.mark.parametrize(
    "diff,msg",
    [("", "empty"), ("just words\n", "no @@ hunk"), ("--- a/other.py\n+++ b/other.py\n@@ -1 +1 @@\n-x\n+y\n", "other.py"),
     ("--- a/kern.py\n+++ b/kern.py\n@@ -1,3 +1,3 @@\n def f(x):\n", "truncated")],
)  # fmt: skip
def test_malformed_diffs_are_refused(store, src_path, diff, msg):
    with pytest.raises(PatchError, match=msg):
        configs.patch_source(store, src_path, diff, WS)
    assert src_path.read_text() == SOURCE


def test_source_patch_that_breaks_python_is_refused(store, src_path):
    diff = config_text.diff_text(SOURCE, SOURCE.replace("return b", "return b)"), "kern.py")
    with pytest.raises(PatchError, match="not valid Python: line 4"):
        configs.patch_source(store, src_path, diff, WS)
    assert src_path.read_text() == SOURCE and store.patches() == []


def test_a_hand_edit_during_a_live_patch_is_kept_and_announced_when_recovery_restores_the_baseline(store, cfg_path):
    """Recovery restores the baseline bytes, but a person's edit of the patched file is not lost
    silently: it is kept beside the backups, and the action and an event say so."""
    before = cfg_path.read_bytes()
    configs.patch_config(store, cfg_path, {**base_cfg(cfg_path), "num_warps": 8}, WS)
    edited = cfg_path.read_text().replace('"num_stages": 2', '"num_stages": 3')  # the person's edit
    cfg_path.write_text(edited)
    done = configs.recover(store)
    assert cfg_path.read_bytes() == before
    assert len(done) == 1 and done[0]["action"].startswith("restored over a hand edit")
    kept = Path(done[0]["action"].split("kept at ")[1].rstrip(")"))
    assert kept.read_text() == edited
    assert any(e["kind"] == "patch.hand_edit" for e in store.events(WS))
