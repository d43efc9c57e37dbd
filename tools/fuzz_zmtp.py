#!/usr/bin/env python3
"""Fuzz the frontend's ZMTP framer (transport/zmtp_protocol.py) for as long as asked: the
properties of tests/transport/test_zmtp_fuzz.py (engine traffic under NULL and CURVE,
generated, mutated and cut into arbitrary reads: nothing raised but ZmtpProtocolError, memory
within its bounds, exactly, and under CURVE only, what the engine sent delivered),
unseeded, round after round. No socket: the framer is sans-io.

    python -m tools.fuzz_zmtp --seconds 600 [--target null|curve|all]

Stops at the first failure, printing hypothesis's smallest example, and exits 1; exits 0
when the time is up. Needs the test extras (hypothesis).
"""

from __future__ import annotations

import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.zmtp_fuzz import (
    check_curve,
    check_null_mutated,
    check_null_valid,
    check_valid_then_garbage,
    curve_session,
    mutated,
    null_traffic,
    reads,
    stray_frame,
)
from tools import fuzz_runner


def _null(data: st.DataObject) -> None:
    traffic = data.draw(null_traffic())
    kind = data.draw(st.sampled_from(["valid", "mutated", "bytes", "garbage"]))
    if kind == "valid":
        check_null_valid(traffic, data.draw(reads(traffic[0])))
    elif kind == "mutated":
        check_null_mutated(data.draw(reads(data.draw(mutated(traffic[0])))))
    elif kind == "bytes":
        tail = data.draw(
            st.one_of(st.binary(max_size=300), st.lists(stray_frame, max_size=8).map(b"".join))
        )
        check_null_mutated(data.draw(reads(traffic[0][: data.draw(st.integers(0, 80))] + tail)))
    else:
        garbage = data.draw(st.one_of(st.binary(max_size=100), mutated(traffic[0])))
        check_valid_then_garbage(traffic, garbage, data.draw(reads(traffic[0])))


def _curve(data: st.DataObject) -> None:
    session = data.draw(curve_session())
    kind = data.draw(st.sampled_from(["valid", "mutated", "strays"]))
    if kind == "valid":
        check_curve(session, data.draw(reads(session.stream)), mutated=False)
    elif kind == "mutated":
        stream = data.draw(mutated(session.stream))
        check_curve(session, data.draw(reads(stream)), mutated=True)
    else:
        strays = data.draw(st.lists(stray_frame, min_size=1, max_size=4).map(b"".join))
        check_curve(session, data.draw(reads(session.stream + strays)), mutated=True)


#: Examples per round: small enough that the time limit is kept to within a round.
TARGETS = {"null": (_null, 1000), "curve": (_curve, 300)}


def property_for(target: str):
    check, examples = TARGETS[target]

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def prop(data: st.DataObject) -> None:
        check(data)

    return prop


def main() -> int:
    return fuzz_runner.main(
        "tools.fuzz_zmtp",
        __doc__.split("\n\n")[0],
        {t: n for t, (_, n) in TARGETS.items()},
        property_for,
    )


if __name__ == "__main__":
    sys.exit(main())
