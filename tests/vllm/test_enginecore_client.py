"""trioserve's EngineCore client (``trioserve.enginecore.client``) against a real headless
vLLM EngineCore: the session's (tests/helpers/enginecore_session.py), one client per test,
re-joined on addresses the engine was handed at its handshake.

What a user of the direct path would notice: the engine's greedy answer is vLLM's own
server's, token for token; an abort reaches vLLM's scheduler; several clients share one
engine, each getting its own outputs; a restarted client's predecessor's requests are
aborted in the engine; an ERROR output ends its request only.
"""

from __future__ import annotations

import httpx
import pytest
import trio

from tests.helpers.enginecore_session import ANSWER_GUARD, Collect, HeadlessEngine, request
from tests.helpers.vllm_session import MODEL, Vllm
from trioserve.enginecore import codec

pytestmark = pytest.mark.integration

PROMPT = [0, 57, 101, 33, 250, 7]


async def idle(client, *, other: Collect | None = None) -> codec.SchedulerStats:
    """vLLM's scheduler figures once it runs and queues nothing: sent with a step's outputs,
    so a short request is run until a step reports the engine otherwise idle."""
    with trio.fail_after(ANSWER_GUARD):
        n = 0
        while True:
            n += 1
            probe = Collect()
            client.add(request(f"probe-{id(probe)}-{n}", PROMPT, max_tokens=1), probe)
            await probe.answer()
            stats = client.scheduler_stats
            if stats is not None and stats.num_running_reqs == 0 and stats.num_waiting_reqs == 0:
                return stats
            await trio.sleep(0.05)


async def test_greedy_token_ids_are_vllms_own_servers(enginecore: HeadlessEngine, vllm: Vllm):
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    async with httpx.AsyncClient(timeout=ANSWER_GUARD) as http:
        answer = (await http.post(vllm.reference_url + "/v1/completions", json=body)).json()
    expected = answer["choices"][0]["token_ids"]
    assert len(expected) == 24
    async with enginecore.client() as client:
        assert client.ready.vllm_version.startswith("0.32")
        sink = Collect()
        client.add(request("greedy", PROMPT, max_tokens=24, ignore_eos=True), sink)
        assert await sink.answer() == expected
        assert sink.finish_reason == codec.FinishReason.LENGTH
        assert len(sink.outputs) > 1  # streamed: one delta per step
        assert client.in_flight == 0


async def test_an_abort_reaches_vllms_scheduler(enginecore: HeadlessEngine):
    async with enginecore.client() as client:
        long = Collect()
        client.add(request("to-abort", PROMPT, max_tokens=3000, ignore_eos=True), long)
        with trio.fail_after(ANSWER_GUARD):
            await long.first.wait()
        client.abort(["to-abort"])
        assert client.in_flight == 0
        before = len(long.outputs)
        stats = await idle(client)
        # vLLM's scheduler runs nothing now: the abort reached it.
        assert stats.kv_cache_usage == 0.0
        assert len(long.outputs) == before  # nothing reached the sink after the abort
        assert long.finish_reason is None and long.lost_reason is None


async def test_two_clients_of_one_engine_get_their_own_outputs(enginecore: HeadlessEngine):
    async with enginecore.client(1) as first, enginecore.client(2) as second:
        a, b = Collect(), Collect()
        first.add(request("from-1", PROMPT, max_tokens=12, ignore_eos=True), a)
        second.add(request("from-2", PROMPT[:3], max_tokens=5, ignore_eos=True), b)
        answers = [await a.answer(), await b.answer()]
        assert [len(x) for x in answers] == [12, 5]
        assert first.unknown_outputs == second.unknown_outputs == 0
        # The same prompt on one client gives the same greedy answer as on the other.
        c = Collect()
        second.add(request("again-on-2", PROMPT, max_tokens=12, ignore_eos=True), c)
        assert await c.answer() == answers[0]


async def test_a_restarted_client_aborts_its_predecessors_requests(enginecore: HeadlessEngine):
    async with enginecore.client(1) as gone:
        orphan = Collect()
        gone.add(request("orphan", PROMPT, max_tokens=3000, ignore_eos=True), orphan)
        with trio.fail_after(ANSWER_GUARD):
            await orphan.first.wait()
        # The client goes away without aborting: the engine keeps generating for it.
    async with enginecore.client(1) as again:
        with trio.fail_after(ANSWER_GUARD):
            while again.unknown_outputs == 0:
                await trio.sleep(0.05)
        # Its outputs came to the new client on those addresses, which aborted it.
        stats = await idle(again)
        assert stats.num_running_reqs == 0 and stats.kv_cache_usage == 0.0


async def test_an_error_output_ends_its_request_only(enginecore: HeadlessEngine):
    async with enginecore.client() as client:
        fine = Collect()
        client.add(request("fine", PROMPT, max_tokens=40, ignore_eos=True), fine)
        broken = Collect()
        bad = request("no-backend", PROMPT)
        assert bad.sampling_params is not None
        # Structured outputs without the backend the frontend must choose: the engine
        # refuses the request with an ERROR output.
        bad.sampling_params.structured_outputs = codec.StructuredOutputsParams(regex="a+")
        client.add(bad, broken)
        with trio.fail_after(ANSWER_GUARD):
            await broken.ended.wait()
        assert broken.finish_reason == codec.FinishReason.ERROR
        assert broken.lost_reason is None and broken.ends == 1
        assert len(await fine.answer()) == 40
        assert client.failure is None


async def test_a_utility_call_is_answered_and_a_failed_one_says_why(enginecore: HeadlessEngine):
    from trioserve.errors import EngineCallError

    async with enginecore.client() as client:
        assert await client.call_utility("get_supported_tasks", timeout=ANSWER_GUARD) == [
            "generate"
        ]
        with pytest.raises(EngineCallError, match="no_such_method"):
            await client.call_utility("no_such_method", timeout=ANSWER_GUARD)
        assert client.failure is None
