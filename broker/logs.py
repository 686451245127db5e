"""The process's logging: text lines (the default) or JSON, one object per line.

A JSON line has ``time`` (ISO 8601, UTC, milliseconds), ``level``, ``node`` (the
broker's persistent node id), ``runtime`` (this process's runtime id: a restarted broker
is a new runtime, docs/design.md §7), ``logger``, ``message``, then every field a call
passed with ``extra=``, and ``exc`` with the traceback when one was logged. ``node`` and
``runtime`` are null until the broker knows them (and in commands that run no broker).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any

__all__ = ["JsonFormatter", "TEXT_FORMAT", "set_identity", "setup"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: The attributes every LogRecord has; any other attribute came from ``extra=``.
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None))
) | {"message", "asctime", "taskName"}


class _Identity:
    """Which broker runtime this process is, for the JSON lines."""

    __slots__ = ("node", "runtime")

    def __init__(self) -> None:
        self.node: str | None = None
        self.runtime: str | None = None


_IDENTITY = _Identity()


def set_identity(node: str | None, runtime: str | None) -> None:
    """Name the broker runtime in every JSON line from now on (called by the broker
    once its node id is known, and again when it restarts as a new runtime)."""
    _IDENTITY.node = node
    _IDENTITY.runtime = runtime


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring for its fields)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "node": _IDENTITY.node,
            "runtime": _IDENTITY.runtime,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def setup(level: str, fmt: str) -> None:
    """Log at ``level`` and above to stderr, as ``fmt`` ("text" or "json"); replaces
    any earlier setup of the root logger."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
