"""The engine side's protocol logic, sans-io: frames in, actions and frames out."""

from __future__ import annotations

import pytest

from trioserve.engine_programs.mock import CAPABILITIES, MockBackend
from trioserve.protocol import (
    PROTOCOL_VERSION,
    Abort,
    Hello,
    Limits,
    Outputs,
    Ping,
    Pong,
    Reject,
    Submit,
    Welcome,
    decode,
    encode,
)
from trioserve.sdk import EngineCore, Output
from trioserve.sdk.core import Cancel, Start

A, B = b"frontend-a", b"frontend-b"


def sent(core: EngineCore) -> list[tuple[bytes, object]]:
    return [(ident, decode(frame)) for ident, frame in core.flush()]


@pytest.fixture
def core() -> EngineCore:
    return EngineCore(MockBackend(), frontend_timeout=5.0, track_ends=True)


def submit(request_id: str) -> bytes:
    return encode(Submit(request_id, "mock", "completion", {"prompt": "x"}))


def test_hello_is_welcomed_with_models_capabilities_and_session(core):
    assert core.handle(A, encode(Hello(PROTOCOL_VERSION, "a")), now=0) == []
    [(ident, welcome)] = sent(core)
    assert ident == A and isinstance(welcome, Welcome)
    assert [m.id for m in welcome.models] == ["mock"]
    assert welcome.capabilities == list(CAPABILITIES)
    assert welcome.session == core.session and welcome.frontend_timeout == 5.0


def test_other_protocol_version_is_rejected(core):
    core.handle(A, encode(Hello(PROTOCOL_VERSION + 1, "a")), now=0)
    [(_, reject)] = sent(core)
    assert isinstance(reject, Reject) and reject.protocol_version == PROTOCOL_VERSION


def test_ping_reports_load(core):
    core.handle(A, submit("r1"), now=0)
    core.handle(A, encode(Ping(3)), now=0)
    [(_, pong)] = sent(core)
    assert pong == Pong(3, core.session, running=1, queued=0)


def test_outputs_of_one_step_leave_in_one_frame_per_frontend(core):
    for ident, rid in [(A, "r1"), (A, "r2"), (B, "r1")]:
        [start] = core.handle(ident, submit(rid), now=0)
        assert isinstance(start, Start)
    for key in [(A, "r1"), (A, "r2"), (B, "r1")]:
        assert core.output(key, Output("tok"))
    frames = sent(core)
    assert len(frames) == 2
    by_ident = dict(frames)
    assert [i.request_id for i in by_ident[A].items] == ["r1", "r2"]
    assert [i.request_id for i in by_ident[B].items] == ["r1"]


def test_sequence_numbers_count_per_request(core):
    core.handle(A, submit("r1"), now=0)
    core.output((A, "r1"), Output("a"))
    core.output((A, "r1"), Output("b", finish_reason="stop"))
    [(_, outputs)] = sent(core)
    assert isinstance(outputs, Outputs)
    assert [(i.seq, i.finish_reason) for i in outputs.items] == [(0, None), (1, "stop")]
    assert core.ends[(A, "r1")] == ["finished"]
    assert not core.output((A, "r1"), Output("late"))


def test_what_a_backend_says_of_tokens_and_prompt_reaches_the_frontend_on_the_wire(core):
    # A token-id backend (the shared vLLM engine) sets a request's token ids, and on its
    # first output the prompt's ids and logprobs; the items carry them as it gave them.
    prompt_logprobs = [None, {"7": {"logprob": -1.5, "rank": 2, "decoded_token": "x"}}]
    core.handle(A, submit("r1"), now=0)
    core.output(
        (A, "r1"),
        Output("a", token_ids=[9], prompt_token_ids=[1, 7], prompt_logprobs=prompt_logprobs),
    )
    core.output((A, "r1"), Output("b", token_ids=[10], finish_reason="stop"))
    [(_, outputs)] = sent(core)
    first, last = outputs.items
    assert (first.token_ids, first.prompt_token_ids) == ([9], [1, 7])
    assert first.prompt_logprobs == prompt_logprobs
    assert (last.token_ids, last.prompt_token_ids, last.prompt_logprobs) == ([10], None, None)


def test_abort_cancels_once_and_ignores_unknown_ids(core):
    core.handle(A, submit("r1"), now=0)
    actions = core.handle(A, encode(Abort(["r1", "ghost"])), now=0)
    assert actions == [Cancel((A, "r1"), "abort")]
    assert core.handle(A, encode(Abort(["r1"])), now=0) == []
    assert core.ends[(A, "r1")] == ["aborted"]
    assert (core.stats.aborted, core.stats.unknown_aborts) == (1, 2)


def test_same_request_id_from_two_frontends_are_two_requests(core):
    core.handle(A, submit("r1"), now=0)
    core.handle(B, submit("r1"), now=0)
    core.handle(A, encode(Abort(["r1"])), now=0)
    assert (B, "r1") in core.running and (A, "r1") not in core.running


def test_duplicate_request_id_gets_a_409_error_item(core):
    core.handle(A, submit("r1"), now=0)
    assert core.handle(A, submit("r1"), now=0) == []
    [(_, outputs)] = sent(core)
    assert outputs.items[0].error.status == 409
    assert (A, "r1") in core.running  # the first one keeps running


def test_silent_frontend_has_its_requests_aborted_by_the_engine(core):
    core.handle(A, submit("r1"), now=0)
    core.handle(B, submit("r2"), now=0)
    core.handle(B, encode(Ping(1)), now=4.0)
    assert core.expire(now=4.9) == []
    assert core.expire(now=5.5) == [Cancel((A, "r1"), "orphaned")]
    assert core.ends[(A, "r1")] == ["orphaned"] and (B, "r2") in core.running
    assert core.stats.orphaned == 1
    # Should the frontend only have been slow, it is told the request is over.
    [outputs] = [message for ident, message in sent(core) if ident == A]
    assert outputs.items[0].error.status == 503
    assert outputs.items[0].error.type == "frontend_timeout"


def test_malformed_frame_is_counted_and_dropped(core):
    assert core.handle(A, b"\x00garbage", now=0) == []
    assert core.stats.malformed_frames == 1
    assert list(core.flush()) == []


# -- drain ------------------------------------------------------------------------------


def test_drain_tells_every_frontend_heard_from_at_once(core):
    core.handle(A, encode(Ping(1)), now=0)
    core.handle(B, submit("r1"), now=0)
    sent(core)
    core.drain()
    pongs = sent(core)
    assert sorted(ident for ident, _ in pongs) == [A, B]
    for _, pong in pongs:
        assert isinstance(pong, Pong) and pong.draining and pong.session == core.session
    core.drain()  # idempotent: nobody is told twice
    assert sent(core) == []


def test_a_draining_engine_refuses_new_requests_with_a_retryable_503(core):
    core.handle(A, submit("running"), now=0)
    core.drain()
    sent(core)
    assert core.handle(A, submit("late"), now=0) == []
    [(_, outputs)] = sent(core)
    [item] = outputs.items
    assert (item.request_id, item.seq) == ("late", 0)
    assert item.error.status == 503 and item.error.type == "engine_draining"
    assert "draining" in item.error.message
    # The refusal is the request's one end at the engine; the running one goes on.
    assert core.ends[(A, "late")] == ["finished"]
    assert list(core.running) == [(A, "running")] and not core.idle
    assert (core.stats.submitted, core.stats.finished, core.stats.refused) == (2, 1, 1)


def test_welcome_and_pongs_say_draining_once_it_began(core):
    core.handle(A, encode(Hello(PROTOCOL_VERSION, "a")), now=0)
    core.handle(A, encode(Ping(1)), now=0)
    [(_, welcome), (_, pong)] = sent(core)
    assert not welcome.draining and not pong.draining
    core.drain()
    sent(core)
    core.handle(B, encode(Hello(PROTOCOL_VERSION, "b")), now=0)
    core.handle(A, encode(Ping(2)), now=0)
    [(_, welcome), (_, pong)] = sent(core)
    assert welcome.draining and pong.draining and pong.seq == 2


def test_cut_off_ends_each_running_request_once_with_engine_stopped(core):
    for request_id in ("r1", "r2"):
        core.handle(A, submit(request_id), now=0)
    core.output((A, "r1"), Output("hi"))
    core.drain()
    sent(core)
    actions = core.cut_off()
    assert sorted(a.key for a in actions) == [(A, "r1"), (A, "r2")]
    assert all(isinstance(a, Cancel) for a in actions)
    [(_, outputs)] = sent(core)
    by_id = {item.request_id: item for item in outputs.items}
    assert by_id["r1"].seq == 1 and by_id["r2"].seq == 0  # the next seq of each
    assert {item.error.type for item in outputs.items} == {"engine_stopped"}
    assert core.idle and core.cut_off() == []
    assert core.ends == {(A, "r1"): ["finished"], (A, "r2"): ["finished"]}
    assert (core.stats.finished, core.stats.cut_off) == (2, 2)
    # An abort crossing the cut-off finds nothing to end.
    assert core.handle(A, encode(Abort(["r1"])), now=0) == []
    assert core.ends[(A, "r1")] == ["finished"]


def test_a_request_over_the_limit_is_refused_and_counted():
    limited = EngineCore(MockBackend(), limits=Limits(max_requests=1), track_ends=True)
    limited.handle(A, submit("r1"), now=0)
    limited.handle(A, submit("r2"), now=0)
    [(_, outputs)] = sent(limited)
    assert outputs.items[0].error.status == 503
    assert (limited.stats.finished, limited.stats.refused) == (1, 1)
