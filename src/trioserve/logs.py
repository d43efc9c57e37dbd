"""How trioserve's logs are written: ``--log-format text`` (a line for people) or ``json``
(one JSON object a line, for log collectors). The access log's fields
(``http/observe.py``) are keys of its JSON lines."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (ISO 8601, UTC), ``level``, ``logger``,
    ``message``, the access log's fields where the record has them (``access``), and
    ``exception`` (the traceback) where it has one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        access = getattr(record, "access", None)
        if isinstance(access, dict):
            entry.update(access)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        utc = time.gmtime(record.created)
        return time.strftime("%Y-%m-%dT%H:%M:%S", utc) + f".{int(record.msecs):03d}Z"


def configure(level: str, fmt: str = "text") -> None:
    """Log to stderr at ``level`` (a name: ``info``), in ``fmt`` (``text`` or ``json``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
