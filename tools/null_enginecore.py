"""A stand-in for vLLM's EngineCore that costs nothing per token: the engine of a frontend
benchmark, where the frontend must be what limits the figures.

On these CPU machines the real model saturates its core before any frontend does (every side
of ``tools/bench_vllm.py`` serves what the model computes), so requests/s and tokens/s say
more about the model's batching than about the frontend. This program speaks EngineCore's
boundary as a headless vLLM engine does (``vllm serve MODEL --headless``): it connects to the
client's handshake socket, says HELLO, takes the client's addresses, registers with a ready
response on each input socket and says READY; then it answers every ADD with ``max_tokens``
tokens, one a step for every running request, batched per client as EngineCore batches its
outputs, ABORT ends a request without a word (as vLLM's does), and utility calls are
answered (``get_supported_tasks``; ``None`` for the rest). Any client of the boundary can be
measured against it: trioserve's direct path (``trioserve run --vllm MODEL --vllm-attach
HOST:PORT``) and vLLM's own API server with no engine of its own (``vllm serve MODEL
--data-parallel-size-local 0 --data-parallel-address HOST --data-parallel-rpc-port PORT``).

The tokens are the model's own ids of a fixed text (``--model``: its ``tokenizer.json``),
cycled, never an end-of-sequence id, so both frontends detokenize the same real text. Steps
follow each other as fast as the engine's loop turns (``--step-ms`` sets a floor between
them); a step's outputs go out as one message per client, the request's first token in the
step after its ADD. Not a model: no sampling, no stop tokens, no logprobs.

    python -m tools.null_enginecore --handshake tcp://127.0.0.1:29550 --model DIR
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec
import zmq

from trioserve.enginecore import codec

#: The text whose token ids every answer cycles through.
TEXT = (
    "The quick brown fox jumps over the lazy dog, and then it keeps running through the "
    "forest, past the river and the old mill, until the evening comes. "
)


def answer_ids(model_dir: Path) -> list[int]:
    """The token ids every answer cycles through: :data:`TEXT` in the model's vocabulary."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = tokenizer.encode(TEXT, add_special_tokens=False).ids
    if not ids:
        raise SystemExit(f"{model_dir}: the tokenizer makes no ids of the answer's text")
    return ids


class _Request:
    __slots__ = ("client", "id", "left", "position")

    def __init__(self, request_id: str, client: int, max_tokens: int, position: int) -> None:
        self.id = request_id
        self.client = client
        self.left = max_tokens
        self.position = position


class NullEngine:
    """The engine's state: its clients' sockets and the requests running."""

    def __init__(
        self,
        inputs: list[zmq.Socket[bytes]],
        outputs: list[zmq.Socket[bytes]],
        ids: Sequence[int],
        max_num_seqs: int,
    ) -> None:
        self.inputs = inputs
        self.outputs = outputs
        self.ids = list(ids)
        self.max_num_seqs = max_num_seqs
        self.running: dict[str, _Request] = {}
        self.waiting: dict[str, _Request] = {}
        self.encoder = msgspec.msgpack.Encoder()
        self.steps = 0
        self.tokens = 0
        #: A request came or went since the last step: the next step says so in its
        #: scheduler figures, even with nothing running (the running gauges drop to 0).
        self.changed = False

    def on_input(self, client: int, frames: list[bytes]) -> None:
        kind = frames[0]
        self.changed = self.changed or kind != codec.RequestType.UTILITY.value
        if kind == codec.RequestType.ADD.value:
            request = codec.decode_request(frames[1:])
            sampling = request.sampling_params
            max_tokens = sampling.max_tokens if sampling is not None else 16
            if max_tokens is None:
                max_tokens = 16
            position = len(request.prompt_token_ids or ())
            item = _Request(request.request_id, request.client_index, max_tokens, position)
            if len(self.running) < self.max_num_seqs:
                self.running[item.id] = item
            else:
                self.waiting[item.id] = item
        elif kind == codec.RequestType.ABORT.value:
            for request_id in msgspec.msgpack.decode(frames[1]):
                self.running.pop(request_id, None)
                self.waiting.pop(request_id, None)
        elif kind == codec.RequestType.UTILITY.value:
            client_index, call_id, method, _args = msgspec.msgpack.decode(frames[1])
            value = ["generate"] if method == "get_supported_tasks" else None
            answer = codec.UtilityOutput(call_id, None, [None, value])
            self._send(client_index, codec.EngineCoreOutputs(utility_output=answer))

    def step(self) -> None:
        """One token for every running request, one message per client."""
        by_client: dict[int, list[codec.EngineCoreOutput]] = {}
        finished: dict[int, list[str]] = {}
        ids = self.ids
        for request in list(self.running.values()):
            token = ids[request.position % len(ids)]
            request.position += 1
            request.left -= 1
            reason = None
            if request.left <= 0:
                reason = codec.FinishReason.LENGTH
                del self.running[request.id]
                finished.setdefault(request.client, []).append(request.id)
            by_client.setdefault(request.client, []).append(
                codec.EngineCoreOutput(request.id, [token], finish_reason=reason)
            )
        self.tokens += sum(len(outputs) for outputs in by_client.values())
        while self.waiting and len(self.running) < self.max_num_seqs:
            request_id = next(iter(self.waiting))
            self.running[request_id] = self.waiting.pop(request_id)
        now = time.monotonic()
        # The scheduler's figures with every client's outputs, as an engine that logs
        # stats sends them (routing and the running gauges read them).
        stats = codec.SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            step_counter=self.steps,
        )
        for client in range(len(self.outputs)):
            outputs = by_client.get(client)
            if outputs is None and not self.changed:
                continue
            self._send(
                client,
                codec.EngineCoreOutputs(
                    outputs=outputs or [],
                    scheduler_stats=stats,
                    timestamp=now,
                    finished_requests=finished.get(client),
                ),
            )
        self.steps += 1
        self.changed = False

    def _send(self, client: int, message: codec.EngineCoreOutputs) -> None:
        self.outputs[client].send(self.encoder.encode(message), copy=False)


def _ready(max_model_len: int, max_num_seqs: int) -> codec.EngineCoreReadyResponse:
    return codec.EngineCoreReadyResponse(
        max_model_len=max_model_len,
        num_gpu_blocks=max_num_seqs * max_model_len // 16 + 1,
        block_size=16,
        dp_stats_address=None,
        dtype="float32",
        vllm_version="0.32.0",
        world_size=1,
        data_parallel_size=1,
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        decode_context_parallel_size=1,
        data_parallel_rank=0,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(max_model_len, 2048),
        instance_id="null",
        supports_lora=False,
        max_loras=0,
    )


def serve(handshake_address: str, ids: Sequence[int], options: argparse.Namespace) -> None:
    """Handshake as a headless engine, then serve until the client goes or a signal comes."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    identity = (0).to_bytes(2, "little")
    handshake = ctx.socket(zmq.DEALER)
    handshake.setsockopt(zmq.LINGER, 0)
    handshake.setsockopt(zmq.IDENTITY, identity)
    handshake.connect(handshake_address)
    status = {"local": False, "headless": True}
    handshake.send(msgspec.msgpack.encode({"status": "HELLO", **status}))
    init = msgspec.msgpack.decode(handshake.recv())
    addresses = init["addresses"]
    inputs, outputs = [], []
    for input_address, output_address in zip(
        addresses["inputs"], addresses["outputs"], strict=True
    ):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IDENTITY, identity)
        sock.connect(input_address)
        sock.send(codec.encode_ready_response(_ready(options.max_model_len, options.max_num_seqs)))
        inputs.append(sock)
        out = ctx.socket(zmq.PUSH)
        out.setsockopt(zmq.LINGER, 0)
        out.connect(output_address)
        outputs.append(out)
    handshake.send(msgspec.msgpack.encode({"status": "READY", **status}))
    print(f"null EngineCore: ready, {len(inputs)} client(s)", file=sys.stderr, flush=True)

    engine = NullEngine(inputs, outputs, ids, options.max_num_seqs)
    poller = zmq.Poller()
    for sock in inputs:
        poller.register(sock, zmq.POLLIN)
    floor = options.step_ms / 1000
    last_step = 0.0
    try:
        while True:
            if engine.running or engine.changed:
                timeout = max(0.0, last_step + floor - time.monotonic()) * 1000
            else:
                timeout = None
            for sock, _ in poller.poll(timeout):
                client = inputs.index(sock)
                # Everything queued, before the next step (as EngineCore's input thread).
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    engine.on_input(client, frames)
            if (engine.running or engine.changed) and time.monotonic() >= last_step + floor:
                last_step = time.monotonic()
                engine.step()
    except KeyboardInterrupt:
        pass
    finally:
        print(
            f"null EngineCore: {engine.steps} steps, {engine.tokens} tokens",
            file=sys.stderr,
            flush=True,
        )
        ctx.destroy(linger=0)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--handshake", required=True, help="the client's handshake address")
    parser.add_argument("--model", required=True, type=Path, help="the model's directory")
    parser.add_argument("--max-model-len", type=int, default=16384)
    parser.add_argument("--max-num-seqs", type=int, default=512)
    parser.add_argument(
        "--step-ms", type=float, default=0.0, help="the least time between two steps"
    )
    options = parser.parse_args(argv)
    serve(options.handshake, answer_ids(options.model), options)


if __name__ == "__main__":
    main()
