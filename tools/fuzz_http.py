#!/usr/bin/env python3
"""Fuzz the built-in HTTP/1.1 server for as long as asked: the properties of
tests/server/http1/test_fuzz.py, from tests/helpers/http1_fuzz.py (the sans-io parser; a
running server on 127.0.0.1 that must survive each connection, HTTP or WebSocket frames,
and serve the next request), unseeded, round after round.

    python -m tools.fuzz_http --seconds 600 [--target parser|server|websocket|all]

Stops at the first failure, printing hypothesis's smallest example, and exits 1; exits 0
when the time is up. Needs the test extras (hypothesis).
"""

from __future__ import annotations

import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.http1_fuzz import (
    check_parser,
    reads,
    run_server_check,
    traffic,
    websocket_traffic,
)
from tools import fuzz_runner

#: Examples per round: small enough that the time limit is kept to within a round.
ROUND = {"parser": 2000, "server": 200, "websocket": 200}


def property_for(target: str):
    check = check_parser if target == "parser" else run_server_check
    inputs = websocket_traffic if target == "websocket" else traffic

    @settings(
        max_examples=ROUND[target],
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def prop(data: st.DataObject) -> None:
        check(data.draw(reads(data.draw(inputs))))

    return prop


def main() -> int:
    return fuzz_runner.main("tools.fuzz_http", __doc__.split("\n\n")[0], ROUND, property_for)


if __name__ == "__main__":
    sys.exit(main())
