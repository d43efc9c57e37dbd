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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from tests.helpers.vllm_session import START_GUARD, VLLM_OPTIONS, VllmProcess, start
from trioserve.enginecore import codec
from trioserve.enginecore.client import ClientAddresses, open_enginecore_client
from trioserve.enginecore.launcher import engine_command

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

    def output(self, output: codec.EngineCoreOutput) -> None:
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
