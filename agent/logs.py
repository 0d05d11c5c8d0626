"""kinv's log: ``<state dir>/kinv.log``, written through :mod:`logging`.

kinv's modules log through ``logging.getLogger(__name__)`` (loggers under ``kinv.``); the command line
attaches one :class:`StateDirLog` for the command's state dir and detaches it when the command ends.  The
file is opened only once the state dir exists: a command that creates it (``kinv run``) logs from its first
line, because records wait until then; a command that never creates one (a read command, bad input) writes
nothing and creates nothing.  Without the command line (the library in-process, a worker) kinv's INFO
records go nowhere.

The log never costs a command its one line: a log that cannot be opened or written (a read-only state dir,
a full disk) is given up on at the first failure, silently; :attr:`StateDirLog.failed` keeps why.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

LOG_NAME = "kinv.log"
STATE_FILE = "kinv.db"  # a state dir is one that holds it: an empty ./state (a checkout's) gets no log
FORMAT = "%(asctime)s %(levelname)s %(name)s [pid %(process)d]: %(message)s"
_EARLY_MAX = 1000  # records kept while the state dir does not exist yet


class StateDirLog(logging.FileHandler):
    """A file handler on ``DIR/kinv.log`` that opens the file only once DIR exists; until then it keeps the
    records (at most 1000) and writes them first."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self._early: list[logging.LogRecord] = []
        self.failed: OSError | None = None  # why the log was given up on, if it was
        super().__init__(self.directory / LOG_NAME, delay=True, encoding="utf-8")
        self.setFormatter(logging.Formatter(FORMAT, datefmt="%Y-%m-%dT%H:%M:%S%z"))

    def emit(self, record: logging.LogRecord) -> None:
        if self.failed is not None:
            return
        if self.stream is None and not (self.directory / STATE_FILE).is_file():
            if len(self._early) < _EARLY_MAX:
                self._early.append(record)
            return
        early, self._early = self._early, []
        try:
            for r in early:
                super().emit(r)
            super().emit(record)
        except OSError as e:  # opening kinv.log: a read-only state dir, a path that is not a file
            self._give_up(e)

    def handleError(self, record: logging.LogRecord) -> None:
        """A write that failed (a full disk) gives the log up; anything else (a bad log call) is logging's."""
        e = sys.exc_info()[1]
        if isinstance(e, OSError):
            self._give_up(e)
        else:
            super().handleError(record)

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as e:
            self._give_up(e)

    def close(self) -> None:
        try:
            super().close()
        except OSError as e:  # the last buffered lines on a full disk
            self.failed = self.failed or e
            self.stream = None

    def _give_up(self, e: OSError) -> None:
        self.failed = self.failed or e
        self._early = []
        stream, self.stream = self.stream, None
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass  # its buffer could not be written either: dropped with it

    def retarget(self, directory: str | os.PathLike) -> None:
        """Write to DIR/kinv.log from now on, the waiting records first (an internal error where no state dir
        exists: the temp dir's)."""
        self.acquire()
        try:
            if self.stream is not None:
                self.stream.close()
                self.stream = None
            self.directory = Path(directory)
            self.baseFilename = os.path.abspath(self.directory / LOG_NAME)
            self.failed = None
            try:
                self.stream = self._open()
            except OSError as e:
                self._give_up(e)
        finally:
            self.release()

    def discard(self) -> None:
        """Forget the waiting records (a command refused as bad input leaves no trace)."""
        self._early = []

    @property
    def path(self) -> Path:
        return Path(self.baseFilename)


def attach(directory: str | os.PathLike) -> StateDirLog:
    """Log kinv's INFO records and above to DIR/kinv.log (from when DIR exists) until :func:`detach`."""
    handler = StateDirLog(directory)
    handler.setLevel(logging.INFO)
    root = logging.getLogger("kinv")
    handler._level_before = root.level  # type: ignore[attr-defined]
    root.addHandler(handler)
    if root.getEffectiveLevel() > logging.INFO:
        root.setLevel(logging.INFO)
    return handler


def detach(handler: StateDirLog) -> None:
    root = logging.getLogger("kinv")
    root.removeHandler(handler)
    root.setLevel(getattr(handler, "_level_before", logging.NOTSET))
    handler.close()
