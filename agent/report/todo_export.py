"""Todo lists in the formats coding agents take: opencode's ``todowrite`` and Claude Code's ``TodoWrite``
(``kinv todos WS --format opencode|claude``, wrapped as ``{"todos": [...]}`` by the CLI)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import Field

from kinv.agent.report.view_models import TodoView, View
from kinv.agent.report.views import _todo_view
from kinv.kernels.errors import BadInput

OpencodeStatus = Literal["pending", "in_progress", "completed", "cancelled"]
OpencodePriority = Literal["high", "medium", "low"]
ClaudeStatus = Literal["pending", "in_progress", "completed"]
TodoExport = Literal["kinv", "opencode", "claude"]
"""Formats of ``kinv todos --format``: kinv's own rows, opencode's todowrite list, Claude Code's TodoWrite list."""
EXPORT_FORMATS: tuple[str, ...] = ("kinv", "opencode", "claude")


class OpencodeTodo(View):
    id: str = Field(description="todo id")
    content: str = Field(description="what the todo is")
    status: OpencodeStatus = Field(description="opencode todowrite status")
    priority: OpencodePriority = Field(description="opencode todowrite priority")


class ClaudeTodo(View):
    content: str = Field(description="what the todo is (cancelled ones carry a '[cancelled: why] ' prefix)")
    status: ClaudeStatus = Field(description="Claude Code TodoWrite status")
    activeForm: str = Field(description="present-continuous form shown while it runs")  # noqa: N815 (Claude's key)



# --------------------------------------------------------------------------- #
_DONE = {"completed", "complete", "done", "accepted", "accept", "rejected", "reject", "mixed", "inconclusive",
         "closed", "finished"}  # fmt: skip
_CANCELLED = {"cancelled", "canceled", "moot", "skipped", "dropped", "abandoned"}
_ACTIVE = {"in_progress", "running", "active", "started", "measuring", "awaiting_approval", "waiting"}


def _status3(status: str | None) -> str:
    s = (status or "pending").strip().lower().replace("-", "_").replace(" ", "_")
    if s in _CANCELLED:
        return "cancelled"
    if s in _DONE:
        return "completed"
    if s in _ACTIVE:
        return "in_progress"
    return "pending"


def _priority3(priority: str | None) -> str:
    p = (priority or "").strip().lower()
    if p in {"high", "h", "p0", "p1", "critical", "urgent"}:
        return "high"
    if p in {"low", "l", "p3", "p4", "minor"}:
        return "low"
    return "medium"


_VERBS = {"add", "analyze", "apply", "benchmark", "build", "characterize", "check", "close", "compare", "design",
          "document", "estimate", "evaluate", "explore", "fix", "investigate", "measure", "patch", "plan", "profile",
          "publish", "record", "recommend", "report", "revert", "review", "run", "sweep", "test", "time", "try",
          "tune", "update", "validate", "verify", "write"}  # fmt: skip
_DOUBLE = {"run", "get", "set", "put", "stop", "plan", "cut", "map", "ship"}


def _gerund(verb: str) -> str:
    v = verb.lower()
    if v in _DOUBLE:
        g = v + v[-1] + "ing"
    elif v.endswith("ie"):
        g = v[:-2] + "ying"
    elif v.endswith("e") and not v.endswith(("ee", "ye", "oe")):
        g = v[:-1] + "ing"
    else:
        g = v + "ing"
    return g.capitalize() if verb[:1].isupper() else g


def active_form(content: str) -> str:
    """'Measure noise' -> 'Measuring noise'; content that does not start with a verb -> 'Testing <content>'."""
    content = content.strip()
    first, _, rest = content.partition(" ")
    if first.lower() in _VERBS:
        return f"{_gerund(first)} {rest}".rstrip()
    return f"Testing {content}"


def _todo_of(t: TodoView | dict) -> TodoView:
    return t if isinstance(t, TodoView) else _todo_view(t)


def to_opencode(todos: Iterable[TodoView | dict]) -> list[dict]:
    """opencode's todowrite list: {id, content, status, priority}."""
    out = []
    for t in map(_todo_of, todos):
        out.append(OpencodeTodo(id=t.id, content=t.content, status=_status3(t.status),
                                priority=_priority3(t.priority)).model_dump())  # fmt: skip
    return out


def to_claude(todos: Iterable[TodoView | dict]) -> list[dict]:
    """Claude Code's TodoWrite list: {content, status, activeForm}; statuses are pending, in_progress, completed,
    so a cancelled todo becomes completed with its content prefixed '[cancelled: reason] '."""
    out = []
    for t in map(_todo_of, todos):
        status = _status3(t.status)
        content = t.content
        if status == "cancelled":
            status = "completed"
            content = f"[cancelled: {t.reason}] {content}" if t.reason else f"[cancelled] {content}"
        out.append(ClaudeTodo(content=content, status=status,
                              activeForm=t.active_form or active_form(t.content)).model_dump())  # fmt: skip
    return out


def check_format(fmt: str) -> str:
    """FMT if it is one of :data:`EXPORT_FORMATS`, else bad input naming the valid ones."""
    if fmt not in EXPORT_FORMATS:
        shown = fmt if len(fmt) <= 40 else fmt[:40] + "..."
        raise BadInput(f"--format {shown!r} is not a todo format kinv knows; valid: {', '.join(EXPORT_FORMATS)}")
    return fmt


def export_todos(todos: Iterable[TodoView | dict], fmt: str = "kinv") -> list[dict]:
    """Todos in one of :data:`EXPORT_FORMATS`; an unknown format is bad input naming the valid ones."""
    if check_format(fmt) == "opencode":
        return to_opencode(todos)
    if fmt == "claude":
        return to_claude(todos)
    return [_todo_of(t).model_dump() for t in todos]
