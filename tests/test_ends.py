"""The end reasons and the engine request's states: every pair of states walked, on a
real subscription, with the aborts its link is asked for counted."""

from __future__ import annotations

import itertools

import pytest

from trioserve import metrics
from trioserve.ends import TRANSITIONS, EndReason, State, ended_by, transition
from trioserve.engine.subscription import Subscription
from trioserve.errors import EngineLostError
from trioserve.protocol import ErrorInfo, OutputItem


class RecordingLink:
    """A subscription's link that records what it is asked for."""

    address = "test"

    def __init__(self) -> None:
        self.aborts: list[str] = []
        self.forgotten: list[str] = []

    def forget(self, request_id: str) -> None:
        self.forgotten.append(request_id)

    def queue_abort(self, request_id: str) -> None:
        self.aborts.append(request_id)

    def hold(self, sub: Subscription) -> None:
        sub.release()

    def refusal(self, error: ErrorInfo) -> str | None:
        return None


def finish(seq: int = 1) -> OutputItem:
    return OutputItem("r", seq, data="x", finish_reason="stop")


#: How a test drives an open subscription into each state, and how many aborts that
#: asks of its link.
ENTER = {
    State.FINISHED: (lambda sub: sub.deliver(finish()), 0),
    State.CONCLUDED: (lambda sub: sub.conclude(finish()), 1),
    State.ABORTED: (lambda sub: sub.abort(EndReason.CANCEL), 1),
    State.LOST: (lambda sub: sub.fail(EngineLostError("gone"), EndReason.ENGINE_LOST), 1),
}


def test_every_state_but_open_is_entered_from_open_alone():
    assert set(TRANSITIONS) == {(State.OPEN, new) for new in State if new is not State.OPEN}
    for old, new in itertools.product(State, State):
        if (old, new) in TRANSITIONS:
            assert transition(old, new)
        elif old is State.OPEN:  # (OPEN to OPEN: not a change)
            with pytest.raises(ValueError):
                transition(old, new)
        else:
            assert not transition(old, new), (old, new)


@pytest.mark.parametrize(("first", "then"), list(itertools.product(ENTER, ENTER)))
def test_an_engine_request_ends_once_whatever_ends_it_second(first, then):
    link = RecordingLink()
    sub = Subscription(link, "r")
    enter, aborts = ENTER[first]
    enter(sub)
    assert sub.state is first and sub.done
    assert len(link.aborts) == aborts == int(TRANSITIONS[(State.OPEN, first)])
    ENTER[then][0](sub)  # too late: the first end stands
    assert sub.state is first and len(link.aborts) == aborts


def test_a_concluded_request_delivers_its_last_item_and_nothing_the_engine_sends_after():
    link = RecordingLink()
    sub = Subscription(link, "r")
    sub.deliver(OutputItem("r", 0, data="a"))
    last = finish()
    sub.conclude(last)
    sub.deliver(OutputItem("r", 2, data="late"))  # (the link forgot it: cannot happen)
    assert sub.state is State.CONCLUDED and link.aborts == ["r"] and "r" in link.forgotten
    assert list(sub._items)[:2] == [OutputItem("r", 0, data="a"), last]
    assert sub.final is last


def test_a_concluded_request_is_not_failed_over():
    link = RecordingLink()
    sub = Subscription(link, "r")
    sub.retry = lambda sub, reason: pytest.fail("a concluded request moved")
    sub.conclude(finish())
    sub.fail(EngineLostError("gone"), EndReason.ENGINE_LOST)
    assert sub.state is State.CONCLUDED and link.aborts == ["r"]


def test_every_end_reason_has_its_row_and_its_metric_label_from_the_start():
    labels = {sample.labels["reason"] for sample in metrics.ENGINE_ABORTS.collect()[0].samples}
    assert {str(reason) for reason in EndReason} <= labels
    assert "error" in labels and EndReason("error") is EndReason.ERROR
    for reason in EndReason:
        assert ended_by(reason) in (State.ABORTED, State.LOST, State.CONCLUDED)
    assert ended_by(EndReason.ENGINE_FAILED) is State.LOST
    assert ended_by(EndReason.STOP_STRING) is State.CONCLUDED
