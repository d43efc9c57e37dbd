"""How a request ends: the one table of end reasons, and the states of an engine request.

Everything that ends a request early names an :class:`EndReason`, whose value is the
label of ``trioserve_engine_aborts_total``. The request lifecycle, the subscription, the
writers, the response store, the drain and the metrics name these members and nothing
else, so a reason cannot be known to one and missing in another. What a client is told
for each (the HTTP status, error code and message, a WebSocket's close code) is the HTTP
layer's table (``http/errors.py``), which a test holds to one row per member. (Shared by
every layer, like ``errors.py``: it imports nothing of trioserve.)

How a request ended, whether early or not, is its :data:`Ending` (the ``outcome`` label of
the request metrics, its trace's and its access log line's end): an :class:`Outcome` when
no end reason says, else the :class:`EndReason`, or the :data:`Refusal` that kept it from
any engine.

An engine request's state is :class:`State`, and :data:`TRANSITIONS` is every change of
state there is, as h11 keeps its state machine: a subscription changes state only through
:func:`transition`, which refuses any other pair. The rule it writes down is the
exactly-once end (DESIGN.md, invariant 1): an open engine request ends once, and an ended
one never changes again.
"""

from __future__ import annotations

import enum
from typing import NewType, TypeAlias


class EndReason(enum.StrEnum):
    """Why a request ended before its engine finished it.

    A ``str`` (its metric label), so logs and traces print it as they always did. What
    the client is told for each is the HTTP layer's (``http/errors.py``, ``END_ANSWERS``)."""

    #: The client went away (nothing is written: there is no one to tell).
    DISCONNECT = "disconnect"
    DEADLINE = "deadline"
    #: ``DELETE /v1/requests/{id}``, a WebSocket ``cancel``, a Responses cancel.
    CANCEL = "cancel"
    SLOW_CLIENT = "slow_client"
    ENGINE_LOST = "engine_lost"
    #: The engine broke the protocol and is out of service until it recovers.
    ENGINE_FAILED = "engine_failed"
    DRAIN = "drain"
    #: Another member of the same fan-out group (``n`` > 1) failed.
    ABANDONED = "abandoned"
    #: A writer's bug, seen on the engine link's synchronous path.
    INTERNAL_ERROR = "internal_error"
    #: The request's scope was left by a bug with its engine request still open.
    ERROR = "error"
    #: A writer refused what the engine sent (each of these carries its own message).
    RESPONSE_TOO_LARGE = "response_too_large"
    BAD_ENGINE_OUTPUT = "bad_engine_output"
    #: A background response outgrew what the response store holds.
    RESPONSE_OVERFLOW = "response_overflow"
    #: Not a failure: the frontend itself ended the request successfully (a stop string
    #: matched in its text pipeline), so the engine gets one abort and the client a 200.
    STOP_STRING = "stop_string"

    @property
    def engine_gone(self) -> bool:
        """Whether the engine, not the frontend, is why it ended (the request may move to
        another engine before its first output; its state is LOST)."""
        return self in (EndReason.ENGINE_LOST, EndReason.ENGINE_FAILED)


class Outcome(enum.StrEnum):
    """How a request ended when it was not ended early (no :class:`EndReason` says)."""

    #: Its response was complete.
    COMPLETED = "completed"
    #: It ended with the engine's error (an error item), or with a relay that stopped
    #: short of the last output.
    ENGINE_ERROR = "engine_error"


#: The code of the error that refused a request before any engine had it (the codes of
#: ``errors.py``'s ``EngineError`` and ``InputError``).
Refusal = NewType("Refusal", str)

#: How a request ended, as its metrics, its trace and its access log line say: an
#: :class:`Outcome`, the :class:`EndReason` of an early end (``ERROR``: its scope was left by
#: a bug), or the :data:`Refusal` that kept it from any engine. Each is its label's string.
Ending: TypeAlias = Outcome | EndReason | Refusal


class State(enum.StrEnum):
    """An engine request's state (``Subscription.state``)."""

    #: Submitted; the engine owes us outputs and we owe it an end.
    OPEN = "open"
    #: The engine sent its last item: it ended the request itself; no abort is owed.
    FINISHED = "finished"
    #: The frontend decided a successful end (:attr:`EndReason.STOP_STRING`): one abort
    #: left; the last item, the frontend's own, is still to be read.
    CONCLUDED = "concluded"
    #: The frontend gave up on it: one abort left.
    ABORTED = "aborted"
    #: The engine was lost or failed: one abort left, in case it comes back.
    LOST = "lost"


#: Every change of state there is: out of OPEN, once. Whether an abort leaves with it.
TRANSITIONS: dict[tuple[State, State], bool] = {
    (State.OPEN, State.FINISHED): False,
    (State.OPEN, State.CONCLUDED): True,
    (State.OPEN, State.ABORTED): True,
    (State.OPEN, State.LOST): True,
}


def transition(old: State, new: State) -> bool:
    """Whether an engine request goes from ``old`` to ``new``: True for a pair in
    :data:`TRANSITIONS`; False for any pair out of an ended state (the first end stands, a
    later one is a no-op). Raises ValueError for OPEN to OPEN, the one other pair: not a
    change of state, so a caller's bug."""
    if (old, new) in TRANSITIONS:
        return True
    if old is not State.OPEN:
        return False  # ended already: the first end wins, later ones are no-ops
    raise ValueError(f"an engine request cannot go from {old} to {new}")


def ended_by(reason: EndReason) -> State:
    """The state an open engine request is left in when it ends for ``reason``."""
    if reason is EndReason.STOP_STRING:
        return State.CONCLUDED
    return State.LOST if reason.engine_gone else State.ABORTED
