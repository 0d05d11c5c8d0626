"""The close-outs kinv publishes (plans/closeouts/) are true today: each says on its first line which kinv wrote it and
either that its prose predates the derived sentences or that it is as that kinv wrote it, and none contradicts its own tables -- the sentences today's summary
derives from the verdict rows those tables print agree with what the close-out says."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from kinv.agent.report.summary import LevelVerdict, VariantVerdict, summarize

ROOT = Path(__file__).resolve().parents[3]
PUBLISHED = sorted((ROOT / "plans" / "closeouts").glob("*.md"))
HEADER = re.compile(r"> Written by kinv \d+\.\d+\.\d+ on \d{4}-\d\d-\d\d .*"
                    r"(prose predates the derived sentences|as that kinv wrote it, premise lines and all)")
ROW = re.compile(r"^\| (\S+) \|.*\| ([+-]\d+\.\d+)% \[([+-]\d+\.\d+)%, ([+-]\d+\.\d+)%\] \| (\d+\.\d+)% \| "
                 r"(improved|regressed|equivalent|undecided) \|$")  # fmt: skip


def pct(x: str) -> float:
    return math.log1p(float(x) / 100)


def tables(text: str) -> list[VariantVerdict]:
    """Each variant's verdict rows as its table prints them (``## V1: title`` then ``| level | ... | verdict |``)."""
    out = []
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        head, _, body = section.partition("\n")
        m = re.match(r"([A-Za-z][A-Za-z0-9_-]*): ", head)
        if not m or "Verdict:" not in body:
            continue
        rows = [ROW.match(line) for line in body.splitlines()]
        lvs = tuple(LevelVerdict(r[1], r[6], pct(r[2]), pct(r[3]), pct(r[4]), float(r[5]) / 100) for r in rows if r)
        if lvs:
            word = re.search(r"Verdict: \*\*(\w+)\*\*", body)
            out.append(VariantVerdict(m[1], "measured", word[1] if word else None, lvs))
    return out


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: p.name)
def test_a_published_close_out_says_who_wrote_it_and_never_contradicts_its_tables(path):
    text = path.read_text()
    assert HEADER.match(text.splitlines()[0]), text.splitlines()[0]
    outcome = text.split("## Outcome", 1)[1].split("\n## ", 1)[0]
    said = summarize(tables(text), baseline="B", live="B", live_file="f.json")
    beat = [v.id for v in tables(text) if v.beat]
    if "refuted for this kernel shape" in outcome:
        assert said.hypothesis == "refuted", (path.name, said.lines)
    if re.search(r"No variant beat the baseline[.:]", outcome):
        assert not beat, (path.name, beat)
    if "is supported where" in outcome:
        assert said.hypothesis == "supported", (path.name, said.lines)
