"""logs.py: ``--log-format json`` writes one JSON object a line."""

from __future__ import annotations

import json
import logging

from trioserve.logs import JsonFormatter


def record(message: str, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord("trioserve.x", logging.WARNING, __file__, 1, message, (), None)
    for key, value in extra.items():
        setattr(made, key, value)
    return made


def test_a_record_is_one_json_line():
    line = JsonFormatter().format(record('a "quoted"\nmessage'))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == 'a "quoted"\nmessage'
    assert (entry["level"], entry["logger"]) == ("WARNING", "trioserve.x")
    assert entry["time"].endswith("Z") and "T" in entry["time"]


def test_the_access_fields_are_keys_and_a_traceback_is_kept():
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        failed = record("x", access={"status": 404, "path": "/p"}, exc_info=sys.exc_info())
    entry = json.loads(JsonFormatter().format(failed))
    assert (entry["status"], entry["path"]) == (404, "/p")
    assert "ValueError: boom" in entry["exception"]
