"""The text of kernel config files and kernel sources: a config rendered as a new file, the smallest edit of an
existing file's own bytes that makes it a given config, unified diffs of two texts, and a strict unified-diff
apply.  Pure functions: reading, writing, journaling and reverting the files is :mod:`kinv.agent.tools.files.configs`'s."""

from __future__ import annotations

import difflib
import json
import os
import re
from pathlib import Path

from kinv.agent.errors import PatchError
from kinv.kernels.errors import ConfigError
from kinv.kernels.launch_config import config_hash, spec_of, validate_config

HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def render_config(config: dict) -> str:
    """A config as the text of a new file: JSON, indent 2, trailing newline; ``kernel``, ``description``, the
    tunables in the order the kernel's adapter declares them, ``overrides``; optional tunables at their
    defaults are left out (the same config).  A file that exists is never re-rendered: :func:`write_config`
    and :func:`patch_config` edit its own bytes (:func:`edit_config_text`)."""
    names: tuple = ()
    try:
        spec = spec_of(config["kernel"])
        config, names = spec.without_defaults(config), spec.names
    except (KeyError, ImportError, ValueError, TypeError, AttributeError):
        pass
    ordered = {k: config[k] for k in ("kernel", "description", *names, "overrides") if k in config}
    ordered.update({k: v for k, v in config.items() if k not in ordered})
    return json.dumps(ordered, indent=2) + "\n"


def _json_layout(text: str) -> dict:
    """How a JSON file is laid out: its indent, whether it escapes non-ASCII, and what follows the closing
    brace (a trailing newline or not), so a rewrite changes only the lines whose values change."""
    body = text.rstrip()
    lines = body.split("\n")
    indent = None
    if len(lines) > 1:
        second = next((ln for ln in lines[1:] if ln.strip()), "")
        indent = second[: len(second) - len(second.lstrip())] or None
    return {"indent": indent, "ensure_ascii": text.isascii(), "tail": text[len(body):],
            "separators": (",", ": ") if indent is not None else ((", ", ": ") if ", " in body else (",", ":"))}


def _dump(obj, layout: dict) -> str:
    return json.dumps(obj, indent=layout["indent"], ensure_ascii=layout["ensure_ascii"],
                      separators=layout["separators"]) + layout["tail"]  # fmt: skip


def _insert_after(d: dict, after: str | None, key: str, value) -> dict:
    """``d`` with ``key`` inserted just after the key ``after`` (first when None)."""
    items = list(d.items())
    at = next((i + 1 for i, (k, _) in enumerate(items) if k == after), 0) if after is not None else 0
    return dict(items[:at] + [(key, value)] + items[at:])


def edit_config_text(old_text: str, new_config: dict, kernel: str | None = None) -> str:
    """The text to write so that the config file now holding ``old_text`` becomes ``new_config``: the smallest
    edit of the file's own bytes whose config *is* ``new_config`` (same config hash: what the variant arm and the
    correctness gate read back from disk, so the kernel runs exactly the measured config).

    - Key order, indent, ASCII escaping, the trailing newline and every unchanged value are the file's own;
      kinv applies no key order of its own to a file it edits.
    - A tunable whose value changes is set in place; one the file lacks is added after the file's last
      tunable only when ``new_config`` sets it off its default; one the file sets that ``new_config`` leaves
      at its default is set to the default in place (the diff says what is measured).
    - ``description`` is the file's unless ``new_config`` brings its own (an adoption does; a variant does not).
    - ``overrides``: kept byte for byte when they equal ``new_config``'s; otherwise replaced by
      ``new_config``'s (dropped when it has none).  A live override is never kept beside a measured config
      that lacks it, even one that matches no measured level: the file would then name a config other than
      the measured one (its hash, its recordings), which is exactly what must not change.
    - A file that is not a JSON object is replaced by :func:`render_config` of ``new_config``.
    """
    from kinv.kernels.launch_config import spec_of

    try:
        old = json.loads(old_text)
    except (json.JSONDecodeError, RecursionError, ValueError):
        old = None
    if not isinstance(old, dict):
        return render_config(new_config)
    kernel = kernel or new_config.get("kernel") or old.get("kernel")
    spec = spec_of(kernel)
    defaults = spec.defaults()
    new = dict(old)
    last = next((k for k in reversed(list(old)) if k in spec.names), None)
    last = last or next((k for k in ("description", "kernel") if k in old), None)
    for name in spec.names:
        want = new_config.get(name, defaults.get(name))
        if name in old:
            if old[name] != want or type(old[name]) is not type(want):
                new[name] = want
        elif name in new_config and want != defaults.get(name):
            new = _insert_after(new, last, name, want)
            last = name
    if "description" in new_config and new_config["description"] != old.get("description"):
        if "description" in new:
            new["description"] = new_config["description"]
        else:
            new = _insert_after(new, "kernel" if "kernel" in new else None, "description", new_config["description"])
    want_ov = list(new_config.get("overrides") or [])
    try:
        have_ov = validate_config(old, kernel).get("overrides", [])
    except ConfigError:
        have_ov = old.get("overrides")
    if want_ov != have_ov:
        if want_ov:
            new["overrides"] = want_ov
        else:
            new.pop("overrides", None)
    layout = _json_layout(old_text)
    text = _dump(new, layout)
    try:
        got = validate_config(json.loads(text), kernel)
    except ConfigError as exc:
        raise PatchError(f"the edit of the {kernel} config would not be a valid config: {exc}") from None
    if config_hash(got) != config_hash(validate_config(new_config, kernel)):
        raise PatchError(f"the edit of the {kernel} config does not yield the config asked for")
    return text


def diff_text(old: str, new: str, path: str | os.PathLike) -> str:
    """Unified diff of two texts of ``path`` (``a/``/``b/`` prefixes, no-newline markers as git writes them)."""
    name = str(path).lstrip("/")
    out = []
    for line in difflib.unified_diff(_lines(old), _lines(new), f"a/{name}", f"b/{name}"):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def config_diff(old_cfg: dict, new_cfg: dict, path: str | os.PathLike) -> str:
    """Unified diff of the two rendered config files."""
    return diff_text(render_config(old_cfg), render_config(new_cfg), path)


def _lines(text: str) -> list[str]:
    """Split on '\\n' only, keeping the ends (str.splitlines also splits on \\r, \\x0c, ...)."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    return lines + [parts[-1]] if parts[-1] else lines


def apply_unified_diff(text: str, unified_diff: str, path: str | os.PathLike) -> str:
    """Apply a single-file unified diff to ``text`` strictly (no fuzz, no offsets); raises PatchError."""
    hunks = _parse_diff(unified_diff, Path(path))
    old = _lines(text)
    out: list[str] = []
    pos = 0  # lines of ``old`` consumed
    for n, (old_start, old_count, lines) in enumerate(hunks, 1):
        start = old_start - 1 if old_count else old_start  # a pure insertion goes after line old_start
        want = [t for tag, t in lines if tag != "+"]
        if start < pos or start > len(old) or old[start : start + len(want)] != want:
            raise PatchError(f"hunk {n} does not apply at line {old_start} of {path}")
        out += old[pos:start] + [t for tag, t in lines if tag != "-"]
        pos = start + len(want)
    return "".join(out + old[pos:])


def _parse_diff(unified_diff: str, path: Path) -> list[tuple[int, int, list[tuple[str, str]]]]:
    if not isinstance(unified_diff, str) or not unified_diff.strip():
        raise PatchError(f"the diff for {path} is empty; give a unified diff with at least one @@ hunk")
    hunks: list[tuple[int, int, list[tuple[str, str]]]] = []
    files: list[str] = []
    raw = _lines(unified_diff)
    i = 0
    while i < len(raw):  # outside a hunk: headers and free text
        line = raw[i]
        i += 1
        if line.startswith("+++ "):
            files.append(line[4:].split("\t")[0].strip())
        m = HUNK_HEADER.match(line)
        if not m:
            continue
        n = len(hunks) + 1
        old_start, old_count = int(m[1]), int(m[2] if m[2] is not None else 1)
        new_count = int(m[4] if m[4] is not None else 1)
        lines: list[tuple[str, str]] = []
        seen_old = seen_new = 0
        while i < len(raw) and (seen_old < old_count or seen_new < new_count or raw[i].startswith("\\")):
            line = raw[i]
            i += 1
            if line.startswith("\\"):  # "\ No newline at end of file": the previous line has no newline
                if lines:
                    tag, t = lines[-1]
                    lines[-1] = (tag, t[:-1] if t.endswith("\n") else t)
                continue
            if line[:1] in (" ", "+", "-"):
                tag, body = line[0], line[1:]
            elif not line.strip():  # an empty context line that lost its leading space
                tag, body = " ", "\n"
            else:
                raise PatchError(f"hunk {n} of the diff for {path} has a bad line {line.rstrip()!r}")
            seen_old += tag != "+"
            seen_new += tag != "-"
            lines.append((tag, body))
        if seen_old != old_count or seen_new != new_count:
            raise PatchError(f"hunk {n} of the diff for {path} is truncated: its header promises more lines")
        hunks.append((old_start, old_count, lines))
    if len(files) > 1:
        raise PatchError(f"the diff touches {len(files)} files ({', '.join(files)}); give one diff per file")
    if files and files[0] != "/dev/null" and Path(files[0]).name != path.name:
        raise PatchError(f"the diff is for {files[0]!r}, not {path.name!r}")
    if not hunks:
        raise PatchError(f"the diff for {path} has no @@ hunk; give a unified diff (diff -u / git diff)")
    return hunks
