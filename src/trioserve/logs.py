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
    ``fields`` (``worker``: which of ``--workers`` wrote it), ``message``, the access log's
    fields where the record has them (``access``), and ``exception`` (the traceback) where
    it has one."""

    def __init__(self, fields: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.fields = fields or {}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            **self.fields,
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


def configure(level: str, fmt: str = "text", *, worker: int | None = None) -> None:
    """Log to stderr at ``level`` (a name: ``info``), in ``fmt`` (``text`` or ``json``);
    ``worker``: each line says which worker of ``--workers`` wrote it."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter({} if worker is None else {"worker": worker}))
    else:
        tag = "" if worker is None else f" [worker {worker}]"
        handler.setFormatter(logging.Formatter(TEXT_FORMAT.replace("%(name)s:", f"%(name)s{tag}:")))
    logging.basicConfig(level=level.upper(), handlers=[handler])
