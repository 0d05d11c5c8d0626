"""The one exception type of bad input (standard library only, importable from every layer).

The CLI maps :class:`BadInput` (and only it) to exit 2 with its one-line message: a plan, a config file, an
id, an option, an environment variable or a state dir a user gave that kinv cannot use.  Every other
exception is a failed step (exit 1, named) or a bug (exit 1, "internal error" and a traceback in a log).
A ``ValueError`` raised by a bug is therefore not bad input; a ``BadInput`` is a ``ValueError`` so that
code which validates with ``except ValueError`` keeps working.
"""

from __future__ import annotations


class BadInput(ValueError):
    """Input a user gave that kinv cannot use; the message is one line naming the value and what is valid."""
