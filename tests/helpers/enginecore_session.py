"""The session's headless vLLM EngineCore (tests/vllm/conftest.py's ``enginecore`` fixture):
started once, its handshake done once, then served to each test's own client.

The fixture starts ``vllm serve --headless`` (through trioserve's launcher module, on the
tiny model, off the last CPU as the other vLLM processes), does the handshake with client 0
listing :data:`CLIENTS` clients' addresses, keeps the engine's ready response, and closes
its sockets. Each test then opens its clients on those addresses with ``known=`` that ready
response: the engine re-joins a client that binds its addresses again, as it would a
restarted worker's, so every test also exercises that.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import msgspec
import trio

from tests.helpers.frontends import Frontend, start_frontend
from tests.helpers.vllm_session import MODEL, START_GUARD, VLLM_OPTIONS, VllmProcess, start
from trioserve.enginecore import codec
from trioserve.enginecore.client import (
    ClientAddresses,
    EngineCoreClient,
    open_enginecore_client,
)
from trioserve.enginecore.launcher import engine_command
from trioserve.links.vllm import VllmLinks, VllmText
from trioserve.text.assets import ModelText
from trioserve.text.sampling import EngineLimits

#: Clients the session's engine serves (tests that share one engine among several
#: clients use indices 1 and 2).
CLIENTS = 3
#: Seconds a test waits for an answer of the tiny model (a hang guard, not a measurement).
ANSWER_GUARD = 120.0


@attrs.define
class HeadlessEngine:
    python: str
    model_dir: Path
    process: VllmProcess
    pairs: list[ClientAddresses]
    ready: codec.EngineCoreReadyResponse

    def client(self, index: int = 0, **options: Any) -> Any:
        """A client of the session's engine (an async context manager)."""
        options.setdefault("load_timeout", START_GUARD)
        # A hang guard: with every agent's vLLM on one CPU here, an engine step has gone
        # unanswered for more than the default 30 s.
        options.setdefault("heartbeat_timeout", ANSWER_GUARD)
        return open_enginecore_client(self.pairs, index, known=self.ready, **options)


def start_headless_engine(python: str, model_dir: Path, where: Path) -> HeadlessEngine:
    pairs = [ClientAddresses.ipc(str(where), index) for index in range(CLIENTS)]
    started: list[VllmProcess] = []

    def on_bound(address: str) -> None:
        port = int(address.rsplit(":", 1)[1])
        command = engine_command(python, str(model_dir), port, VLLM_OPTIONS)
        started.append(start(command[0], command[1:], where / "enginecore.log"))

    async def handshake() -> codec.EngineCoreReadyResponse:
        ready: list[codec.EngineCoreReadyResponse] = []
        async with trio.open_nursery() as nursery:

            async def watch() -> None:  # an engine that exits while loading says why
                while not started or started[0].process.poll() is None:
                    await trio.sleep(0.5)
                raise RuntimeError(f"the engine exited:\n{started[0].output()[-4000:]}")

            nursery.start_soon(watch)
            async with open_enginecore_client(
                pairs,
                0,
                handshake="tcp://127.0.0.1:*",
                on_handshake_bound=on_bound,
                load_timeout=START_GUARD,
            ) as client:
                ready.append(client.ready)
            nursery.cancel_scope.cancel()
        return ready[0]

    try:
        ready = trio.run(handshake)
    except BaseException:
        for process in started:
            process.stop()
        raise
    return HeadlessEngine(python, model_dir, started[0], pairs, ready)


def request(request_id: str, prompt: Sequence[int], **sampling: Any) -> codec.EngineCoreRequest:
    """A request of token ids; ``sampling`` in vLLM's field names (greedy by default)."""
    sampling.setdefault("temperature", 0.0)
    sampling.setdefault("max_tokens", 8)
    return codec.EngineCoreRequest(
        request_id=request_id,
        prompt_token_ids=list(prompt),
        mm_features=None,
        sampling_params=codec.sampling_params(sampling),
        pooling_params=None,
        arrival_time=time.time(),
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
    )


class Collect:
    """An output sink that keeps what reaches it, in order."""

    def __init__(self) -> None:
        self.outputs: list[codec.EngineCoreOutput] = []
        self.lost_reason: str | None = None
        self.ends = 0
        self.ended = trio.Event()
        self.first = trio.Event()

    def output(self, output: codec.EngineCoreOutput, timestamp: float = 0.0) -> None:
        assert not self.ended.is_set(), f"an output after the end: {output}"
        self.outputs.append(output)
        self.first.set()
        if output.finish_reason is not None:
            self.ends += 1
            self.ended.set()

    def lost(self, reason: str) -> None:
        assert not self.ended.is_set(), f"lost after the end: {reason}"
        self.lost_reason = reason
        self.ends += 1
        self.ended.set()

    @property
    def token_ids(self) -> list[int]:
        return [t for output in self.outputs for t in output.new_token_ids]

    @property
    def finish_reason(self) -> int | None:
        return self.outputs[-1].finish_reason if self.outputs else None

    async def answer(self) -> list[int]:
        with trio.fail_after(ANSWER_GUARD):
            await self.ended.wait()
        assert self.lost_reason is None, self.lost_reason
        return self.token_ids


#: The prefix of the request ids :func:`scheduler_idle` sends.
PROBE = "probe-"


async def scheduler_idle(client: EngineCoreClient) -> codec.SchedulerStats:
    """vLLM's scheduler figures once it runs and queues nothing and its KV cache is empty.
    The engine sends them with a step's outputs (to one client of the step), so a
    one-token probe is run on ``client`` until a step reports the engine otherwise idle."""
    with trio.fail_after(ANSWER_GUARD):
        n = 0
        while True:
            n += 1
            probe = Collect()
            client.add(request(f"{PROBE}{id(probe)}-{n}", [0, 57, 101], max_tokens=1), probe)
            await probe.answer()
            stats = client.scheduler_stats
            if (
                stats is not None
                and stats.num_running_reqs == 0
                and stats.num_waiting_reqs == 0
                and stats.kv_cache_usage == 0.0
            ):
                return stats
            await trio.sleep(0.05)


class Tap:
    """What crossed one client's sockets, read at the wire: the request ids of every ADD
    and ABORT frame it sent, and every output the engine sent it (probes left out)."""

    def __init__(self, client: EngineCoreClient) -> None:
        self.added: list[str] = []
        self.aborted: list[str] = []
        self.outputs: dict[str, list[codec.EngineCoreOutput]] = defaultdict(list)
        send = client._input.send
        on_outputs = client._on_outputs

        def tapped_send(frames: list[bytes]) -> bool:
            kind = frames[1]
            if kind == codec.RequestType.ADD.value:
                self.added.append(codec.decode_request(frames[2:]).request_id)
            elif kind == codec.RequestType.ABORT.value:
                self.aborted.extend(msgspec.msgpack.decode(frames[2]))
            return send(frames)

        def tapped_outputs(frames: list[bytes]) -> None:
            for output in codec.decode_outputs(frames).outputs:
                self.outputs[output.request_id].append(output)
            on_outputs(frames)

        client._input.send = tapped_send  # type: ignore[method-assign]
        client._on_outputs = tapped_outputs  # type: ignore[method-assign]

    @property
    def requests(self) -> list[str]:
        """The ids of the requests added, probes left out."""
        return [r for r in self.added if not r.startswith(PROBE)]

    def generated(self, request_id: str) -> int:
        return sum(len(output.new_token_ids) for output in self.outputs[request_id])

    def finished_in_engine(self, request_id: str) -> bool:
        return any(output.finish_reason is not None for output in self.outputs[request_id])

    async def running(self, request_id: str) -> None:
        """Until the engine has sent an output for ``request_id`` (it runs it)."""
        with trio.fail_after(ANSWER_GUARD):
            while not self.outputs[request_id]:
                await trio.sleep(0.02)

    async def aborted_once(self, request_id: str) -> None:
        """Until an ABORT for ``request_id`` has left."""
        with trio.fail_after(ANSWER_GUARD):
            while request_id not in self.aborted:
                await trio.sleep(0.02)


@attrs.define
class DirectFrontend:
    """A frontend in-process that is a client of the session's EngineCore (the direct
    path's link and text layer), and what crossed that client's sockets."""

    frontend: Frontend
    client: EngineCoreClient
    tap: Tap


async def start_direct_frontend(
    nursery: trio.Nursery,
    engine: HeadlessEngine,
    text: ModelText,
    index: int = 0,
    limits: EngineLimits | None = None,
    **settings: Any,
) -> DirectFrontend:
    """What ``trioserve run --vllm`` serves (direct path), on the session's engine as client
    ``index``, with the built-in server; the client closes with ``nursery``. ``limits``:
    the text pipeline's view of vLLM's server options (by default none given)."""

    async def hold(task_status: trio.TaskStatus[EngineCoreClient]) -> None:
        async with engine.client(index) as client:
            task_status.started(client)
            await trio.sleep_forever()

    client: EngineCoreClient = await nursery.start(hold)
    tap = Tap(client)
    if limits is None:
        limits = EngineLimits(max_model_len=engine.ready.max_model_len)
    links = VllmLinks(client, VllmText(text, limits), [MODEL])
    frontend = await start_frontend(
        nursery, None, server="builtin", links=[(f"vllm://{MODEL}", links)], **settings
    )
    return DirectFrontend(frontend, client, tap)
