"""A kernel's source hash keys its recordings: rewording a comment or a docstring keeps it, so replay still
serves what was measured; changing code changes it, so replay refuses to serve another kernel's samples."""

from __future__ import annotations

import shutil

from kinv.agent.tools.backends.replay_index import Recording
from kinv.agent.tools.worker import hashes
from kinv.kernels.adapter import get_adapter

SRC = '''"""Module docstring."""
import math  # a comment


def scale(x):
    """Twice x."""
    # why twice
    return 2 * x   
'''


def test_comments_docstrings_blank_lines_and_trailing_spaces_do_not_count():
    h = hashes.code_text
    reworded = SRC.replace("Twice x.", "Double x,\n    on two lines.").replace("# why twice", "# because")
    assert h(reworded) == h(SRC)
    assert h(SRC.replace('"""Module docstring."""\n', "")) == h(SRC)
    assert h(SRC.replace("import math  # a comment\n", "import math\n\n\n")) == h(SRC)
    assert "#" not in h(SRC) and "Twice" not in h(SRC)


def test_any_change_to_code_counts():
    h = hashes.code_text
    assert h(SRC.replace("2 * x", "3 * x")) != h(SRC)
    assert h(SRC.replace("    return", "    y = 1\n    return")) != h(SRC)
    # a string that is not a docstring is code, and so is a '#' inside one
    assert h(SRC.replace("return 2 * x", 'return "#" + str(x)')) != h(SRC.replace("return 2 * x", "return str(x)"))
    assert h("def f(:\n  # broken\n") == "def f(:\n  # broken\n"  # text that does not parse is hashed whole


def test_the_kernel_with_a_reworded_docstring_keeps_its_recordings(tmp_path):
    adapter = get_adapter("mla_decode")
    root = tmp_path / "kinv"
    shutil.copytree(adapter.root() / "kernels", root / "kernels", ignore=shutil.ignore_patterns("recordings"))
    live = hashes.kernel_source_hash(adapter)
    src = root / "kernels" / "mla_decode.py"
    text = src.read_text()
    src.write_text(text.replace('"""', '"""Reworded. ', 1).replace("\n\n", "\n\n# a new comment\n\n", 1))
    assert hashes.kernel_source_hash(adapter, root=root) == live
    src.write_text(text.replace("LOG2E = 1.4426950408889634", "LOG2E = 1.4426950408889"))
    assert hashes.kernel_source_hash(adapter, root=root) != live
    # the shipped recordings are keyed by the live source's hash, so replay serves them
    rec = Recording(sorted((adapter.root() / "kernels" / "recordings").glob("*/mla_decode-*.jsonl.gz")),
                           "mla_decode")
    assert rec.headers[0]["kernel_hash"] == live



def test_arms_opening_in_threads_hash_the_kernel_alike_and_without_error():
    """Arms open in threads; each asks for the kernel's hash (CPython 3.11's parser is not safe in threads at
    once: unguarded, this raised SystemError inside a run)."""
    from concurrent.futures import ThreadPoolExecutor

    adapter = get_adapter("mla_decode")
    expected = hashes.kernel_source_hash(adapter)

    def one(_):
        hashes._CODE_HASHES.clear()  # parse again, as a first open would
        return hashes.kernel_source_hash(adapter)

    with ThreadPoolExecutor(8) as ex:
        assert set(ex.map(one, range(64))) == {expected}


def test_the_reference_hash_reads_the_file_as_it_is_now_at_every_call(tmp_path):
    """A reference edited on disk after a hash was taken changes the next hash; putting the text back gives the
    first hash again (a text parsed before is not parsed again, but the file is read every time)."""
    adapter = get_adapter("mla_decode")
    root = tmp_path / "copy"
    for f, _q in adapter.reference_parts:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(adapter.root() / f, root / f)
    first = hashes.reference_hash(adapter, root=root)
    assert hashes.reference_hash(adapter, root=root) == first
    f, qualname = adapter.reference_parts[0]
    text = (root / f).read_text()
    name = qualname.split(".")[-1]
    edited = text.replace(f"def {name}(", f"def {name}(*_unused, ", 1)  # a change to the reference's code
    assert edited != text
    (root / f).write_text(edited)
    assert hashes.reference_hash(adapter, root=root) != first
    (root / f).write_text(text)
    assert hashes.reference_hash(adapter, root=root) == first
    (root / f).unlink()
    assert hashes.reference_hash(adapter, root=root) != first  # a missing file is named, never cached


def test_a_runs_reference_hash_follows_an_edit_of_the_reference_on_disk(tmp_path, monkeypatch):
    """The run's reference hash (asked at every measurement) parses again only when the files' bytes changed, and
    an edit, even a comment in the reference (the fault drill's F5), is seen at the next call."""
    from kinv.agent.tools.worker import hashes

    adapter = get_adapter("mla_decode")
    root = tmp_path / "copy"
    for f, _q in adapter.reference_parts:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(adapter.root() / f, root / f)
    monkeypatch.setattr(adapter, "root", lambda: root)
    first = hashes.kernel_reference_hash("mla_decode")
    assert first == hashes.reference_hash(adapter, root=root) == hashes.kernel_reference_hash("mla_decode")
    f, qualname = adapter.reference_parts[0]
    text = (root / f).read_text()
    name = qualname.split(".")[-1]
    (root / f).write_text(text.replace(f"def {name}(", f"def {name}(*_unused, ", 1))
    assert hashes.kernel_reference_hash("mla_decode") != first
    (root / f).write_text(text)
    assert hashes.kernel_reference_hash("mla_decode") == first
