"""The mock engine: a deterministic backend of the SDK, with faults on demand.

Text is a fixed function of the prompt and the token index, so tests can predict every
token. Timing: the first token after ``ttft_ms``, then one token per ``1/tokens_per_second``
seconds, aligned to a shared step grid so that concurrent requests produce their tokens in
the same step and leave in one frame, as a real batching engine's would.

Per-request knobs, read from ``Submit.params`` (the HTTP routes pass every body field they
do not know through to the engine, these included). They are fault injection: any client
of any frontend could stall the engine for everyone with them, so they work only on an
engine made with ``allow_fault_injection=True`` (``trioserve engine mock
--allow-fault-injection``, ``trioserve run --mock-fault-injection``); otherwise a request
that names one ends with a 400 error item (:data:`FAULT_INJECTION_OFF`):

- ``mock_ttft_ms``, ``mock_tokens_per_second``: override the engine's timing;
- ``mock_error_after`` (tokens) with ``mock_error_status`` (default 500) and
  ``mock_error_message``: end the request with an engine error after N tokens;
- ``mock_hang_after`` (tokens): stop producing after N tokens and wait to be aborted;
- ``mock_stall_s``: block the whole engine (its event loop) for that many seconds before
  the first token, as a hung GPU would; heartbeats stop too;
- ``mock_by_seed``: ``{"<seed>": {knobs}}``, knobs that apply only to the request whose
  ``seed`` param is that number (one image of an ``n > 1`` request, say).
- ``mock_answer``: the answer's text, as the model would write it (tool calls and
  reasoning included: the frontend parses them), ``mock_chars_per_token`` characters per
  token (default :data:`ANSWER_CHARS_PER_TOKEN`); it ends ``stop``, or ``length`` where
  ``max_tokens`` cuts it. So a test or a client can script any model output. The
  request's ``stop`` strings cut it as vLLM cuts an answer (``include_stop_str_in_output``
  too), and the string it stopped at is the final item's ``stop_reason``.

Without ``mock_answer``, an answer whose request sets ``max_tokens`` runs to it and ends
``length``; one without ``max_tokens`` is :data:`DEFAULT_MAX_TOKENS` tokens long and ends
``stop``, as a model that reaches its end of sequence (so a client's happy path, the openai
SDK's ``responses.stream(...).get_final_response()`` say, sees a complete answer). An engine
made with ``answer_tokens=N`` (``trioserve run --mock-answer-tokens N``) ends every answer
``stop`` after N tokens, where ``max_tokens`` leaves room.

A prefix cache, simulated (``prefix_cache`` blocks, off by default): a text prompt is read
in blocks of :data:`PREFIX_BLOCK_WORDS` words, each known by a hash of everything up to its
end, as vLLM's and SGLang's prefix caches know theirs. The leading blocks seen before are
hits: the first token comes sooner (``ttft_ms`` scaled down by :data:`PREFIX_HIT_SAVING`
of the prompt's cached share) and the answer's usage says how many prompt tokens (words)
were cached (``cached_tokens``). The least recently used blocks are forgotten past the
capacity. What it is for: measuring how routing policies keep a session's prefix on one
engine (tools/bench_routing.py).

Every modality a route can ask for is produced (one task each, see :data:`CAPABILITIES`):
text for ``chat``, ``completion`` and ``generate``; a sine tone as 16-bit PCM for
``speech``; a small valid PNG for ``image_generation`` and ``image_edit``; a small byte
payload labelled ``video/mp4`` for ``video_generation``; for ``embedding``, one unit
vector per input (:func:`mock_embedding`), all in one step, as one forward pass of a
batch. Each output is one step (embeddings: one item): the knobs above count them,
whatever the modality.
"""

from __future__ import annotations

import collections
import hashlib
import math
import struct
import time
import zlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import attrs
import sniffio

from ..protocol import ModelCard, Submit, Usage
from ..sdk.core import Output, RequestError

WORDS = tuple(
    (
        "the quick brown fox jumps over lazy dogs while seven wise owls count silver stars "
        "under a quiet northern sky and distant rivers hum old songs of patient stone"
    ).split()
)

#: An answer's length when the request sets no ``max_tokens`` (it then ends ``stop``).
DEFAULT_MAX_TOKENS = 16
#: Characters of a scripted answer (``mock_answer``) per token.
ANSWER_CHARS_PER_TOKEN = 4

#: Per-request params that only an engine started with fault injection allowed obeys.
KNOB_PREFIX = "mock_"
#: The error a request naming a knob gets from an engine that does not allow them.
FAULT_INJECTION_OFF = (
    "the mock engine's fault-injection params (mock_*) are disabled; start the engine "
    "with --allow-fault-injection (trioserve run: --mock-fault-injection) to use them"
)

#: Every task the mock engine serves (its welcome's capabilities).
CAPABILITIES = (
    "chat",
    "completion",
    "generate",
    "speech",
    "image_generation",
    "image_edit",
    "video_generation",
    "embedding",
)
TEXT_TASKS = frozenset({"chat", "completion", "generate"})

#: Speech: 16-bit mono PCM at this rate, one chunk of CHUNK_SAMPLES per input word.
SPEECH_RATE = 24_000
SPEECH_MIME = f"audio/pcm;rate={SPEECH_RATE}"
SPEECH_CHUNK_SAMPLES = 1_200
SPEECH_MAX_CHUNKS = 40
SPEECH_TONE_HZ = 440.0

#: Images: this size unless the request's ``size`` says otherwise (capped, to stay small).
IMAGE_SIZE = (16, 16)
IMAGE_MAX_SIDE = 256

#: Prefix cache: words per block, and the share of the time to first token a fully cached
#: prompt saves (a prompt with a fraction f of its words cached waits
#: ``ttft_ms * (1 - f * PREFIX_HIT_SAVING)``).
PREFIX_BLOCK_WORDS = 16
PREFIX_HIT_SAVING = 0.9

#: Video: frames and bytes per frame of the payload (the ``ftyp`` box comes first).
VIDEO_FRAMES = 8
VIDEO_FPS = 8.0
VIDEO_FRAME_BYTES = 32
VIDEO_MAX_FRAMES = 1_000

#: Embeddings: this many dimensions, fewer with the request's ``dimensions``.
EMBEDDING_DIMENSIONS = 64


async def _sleep(seconds: float) -> None:
    if seconds <= 0:
        return
    if sniffio.current_async_library() == "trio":
        import trio

        await trio.sleep(seconds)
    else:
        import asyncio

        await asyncio.sleep(seconds)


def _next_boundary(now: float, period: float) -> float:
    """The first boundary of the step grid of ``period`` seconds strictly after ``now``."""
    boundary = math.ceil(now / period) * period
    return boundary + period if boundary <= now else boundary


async def _next_step(period: float) -> None:
    """Wait for the next boundary of the engine-wide step grid of ``period`` seconds."""
    if sniffio.current_async_library() == "trio":
        await _trio_step(period)
    else:
        import asyncio

        now = time.monotonic()
        await asyncio.sleep(_next_boundary(now, period) - now)


#: trio: the requests waiting for each step boundary (per trio run), woken together.
_STEPS: dict[tuple[object, float], Any] = {}


async def _trio_step(period: float) -> None:
    """One sleeping task per step boundary, the others parked behind it.

    A ``trio.sleep`` per token is a cancel scope expiring per token, the most expensive
    wake-up trio has: at a thousand streams it was most of the mock's CPU, and a
    benchmark's engine must not be the bottleneck. Here the first request to wait for a
    boundary sleeps until it, and wakes everyone parked behind it; if it is cancelled
    first (its request aborted), the others wake early, see the boundary not reached and
    elect a new sleeper.
    """
    import trio

    boundary = _next_boundary(trio.current_time(), period)
    key = (trio.lowlevel.current_trio_token(), boundary)
    if trio.current_time() >= boundary:
        # Behind the grid (a step shorter than a loop turn): a step still yields, or a
        # fast mock in the frontend's own loop (the tests) would starve everything else.
        await trio.lowlevel.checkpoint()
        return
    while trio.current_time() < boundary:
        lot = _STEPS.get(key)
        if lot is not None:
            await lot.park()
            continue
        lot = _STEPS[key] = trio.lowlevel.ParkingLot()
        try:
            await trio.sleep_until(boundary)
        finally:
            del _STEPS[key]
            lot.unpark_all()


async def _sleep_forever() -> None:
    if sniffio.current_async_library() == "trio":
        import trio

        await trio.sleep_forever()
    else:
        import asyncio

        await asyncio.Event().wait()


def prompt_text(request: Submit) -> str:
    """The text the mock engine 'reads': the prompt, or the chat messages' text."""
    inputs = request.inputs
    for key in ("prompt", "input"):  # "input": speech
        if key in inputs:
            prompt = inputs[key]
            return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
    parts = []
    for message in inputs.get("messages", ()):
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(
                p.get("text", "")
                for p in content
                if isinstance(p, dict) and p.get("type") == "text"
            )
    return "\n".join(parts)


def _prompt_seed(prompt: str) -> int:
    return int.from_bytes(hashlib.blake2b(prompt.encode(), digest_size=4).digest(), "little")


def token_text(prompt: str, index: int) -> str:
    """Token ``index`` of the answer to ``prompt``: deterministic, a word with a space."""
    return " " + WORDS[(_prompt_seed(prompt) + index * 7) % len(WORDS)]


class _LazyTokens(Sequence[Output]):
    """The text steps of one request, made when asked for."""

    def __init__(self, seed: int, count: int) -> None:
        self.seed = seed
        self.length = count  # not ``count``: that is Sequence's method

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: Any) -> Any:
        if not 0 <= index < self.length:
            raise IndexError(index)
        return Output(data=" " + WORDS[(self.seed + index * 7) % len(WORDS)])


def expected_text(prompt: str, max_tokens: int = DEFAULT_MAX_TOKENS) -> str:
    return "".join(token_text(prompt, i) for i in range(max_tokens))


def _digest(*parts: object) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(part if isinstance(part, bytes) else repr(part).encode())
        h.update(b"\x00")
    return h.digest()


def speech_chunks(text: str) -> list[bytes]:
    """The mock's speech for ``text``: a 440 Hz tone, one PCM chunk per word (at least one)."""
    count = min(max(len(text.split()), 1), SPEECH_MAX_CHUNKS)
    chunks = []
    for c in range(count):
        start = c * SPEECH_CHUNK_SAMPLES
        samples = (
            round(9830 * math.sin(2 * math.pi * SPEECH_TONE_HZ * (start + i) / SPEECH_RATE))
            for i in range(SPEECH_CHUNK_SAMPLES)
        )
        chunks.append(struct.pack(f"<{SPEECH_CHUNK_SAMPLES}h", *samples))
    return chunks


def png_image(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A valid PNG of one colour (8-bit RGB), built with zlib and struct only."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    row = b"\x00" + bytes(rgb) * width  # filter type 0, then the pixels
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * height))
        + chunk(b"IEND", b"")
    )


def image_size(size: Any) -> tuple[int, int]:
    """``"WxH"`` (capped at IMAGE_MAX_SIDE); the default for anything else (``"auto"``)."""
    if isinstance(size, str):
        width, sep, height = size.lower().partition("x")
        if sep and width.isdigit() and height.isdigit() and int(width) and int(height):
            return min(int(width), IMAGE_MAX_SIDE), min(int(height), IMAGE_MAX_SIDE)
    return IMAGE_SIZE


def media_bytes(ref: Any) -> bytes:
    """The bytes of a media record of ``Submit.inputs``: inline ``data`` or an upload ``path``."""
    if not isinstance(ref, dict):
        return b""
    data = ref.get("data")
    if isinstance(data, bytes):
        return data
    if isinstance(ref.get("path"), str):
        with open(ref["path"], "rb") as file:  # a small local upload: read it in one go
            return file.read()
    return b""


def mock_image(prompt: str, seed: Any, size: Any = None, source: bytes = b"") -> bytes:
    """The mock's image for a prompt and seed (and the edited image's bytes, for edits)."""
    colour = _digest(prompt, seed, source)[:3]
    return png_image(*image_size(size), (colour[0], colour[1], colour[2]))


def video_chunks(
    prompt: str, seed: Any, frames: int, fps: float, conditioning: bytes = b""
) -> list[bytes]:
    """The mock's video: an ``ftyp`` box, then one chunk per frame, all labelled video/mp4."""
    ftyp = struct.pack(">I4s4sI4s4s", 24, b"ftyp", b"isom", 512, b"isom", b"mp41")
    out = [ftyp]
    for frame in range(frames):
        digest = _digest(prompt, seed, fps, frame, conditioning)
        out.append((digest * (VIDEO_FRAME_BYTES // len(digest) + 1))[:VIDEO_FRAME_BYTES])
    return out


def mock_video(prompt: str, seed: Any, frames: int, fps: float, conditioning: bytes = b"") -> bytes:
    return b"".join(video_chunks(prompt, seed, frames, fps, conditioning))


def mock_embedding(text: str, dimensions: int = EMBEDDING_DIMENSIONS) -> bytes:
    """The mock's embedding of ``text``: packed float32 little-endian, of unit length.

    Component ``i`` of the full vector is ``u_i / 32767.5 - 1``, ``u_i`` the ``i``-th
    little-endian uint16 of SHAKE-256 of the text's UTF-8 bytes; ``dimensions`` < the full
    size keeps the first ones (as Matryoshka models shorten theirs); then the vector is
    scaled to length 1. The same text always gets the same vector."""
    raw = hashlib.shake_256(text.encode()).digest(2 * EMBEDDING_DIMENSIONS)
    values = [u / 32767.5 - 1 for (u,) in struct.iter_unpack("<H", raw)][:dimensions]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return struct.pack(f"<{len(values)}f", *(v / norm for v in values))


def _embedding_steps(inputs: dict[str, Any], params: dict[str, Any]) -> list[Output]:
    texts = inputs.get("input")
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise RequestError(400, "input must be a list of strings", "invalid_request")
    dimensions = params.get("dimensions", EMBEDDING_DIMENSIONS)
    if (
        isinstance(dimensions, bool)
        or not isinstance(dimensions, int)
        or not 1 <= dimensions <= EMBEDDING_DIMENSIONS
    ):
        raise RequestError(
            400,
            f"dimensions must be between 1 and {EMBEDDING_DIMENSIONS} for this model",
            "invalid_request",
        )
    return [Output(mock_embedding(text, dimensions), modality="embedding") for text in texts]


def _number(params: dict[str, Any], name: str, default: float) -> float:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(400, f"{name} must be a number")
    return value


def _optional_int(params: dict[str, Any], name: str) -> int | None:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(400, f"{name} must be a number of tokens")
    return int(value)


def _scripted(params: dict[str, Any], max_tokens: Any) -> tuple[list[Output], str]:
    """The steps of a ``mock_answer``: its text cut every ``mock_chars_per_token``
    characters; ``stop``, or ``length`` where ``max_tokens`` cuts it."""
    answer = params["mock_answer"]
    if not isinstance(answer, str) or not answer:
        raise RequestError(400, "mock_answer must be a non-empty string", "invalid_request")
    size = params.get("mock_chars_per_token", ANSWER_CHARS_PER_TOKEN)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise RequestError(400, "mock_chars_per_token must be a positive integer")
    answer, stop_string = _cut_at_stop(answer, params)
    tokens = [answer[i : i + size] for i in range(0, len(answer), size)]
    if max_tokens is not None and max_tokens < len(tokens):
        return [Output(data=t) for t in tokens[:max_tokens]], "length"
    steps = [Output(data=t) for t in tokens] or [Output()]
    if stop_string is not None:
        steps[-1] = Output(data=steps[-1].data, stop_reason=stop_string)
    return steps, "stop"


def _cut_at_stop(answer: str, params: dict[str, Any]) -> tuple[str, str | None]:
    """``answer`` cut at the first of the request's ``stop`` strings it holds, as vLLM
    cuts (the match that ends earliest wins; the string itself is left out, unless
    ``include_stop_str_in_output``), and that string; the whole answer and None if it
    holds none."""
    stop = params.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if not stop:
        return answer, None
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError(400, "stop must be a string or a list of non-empty strings")
    ends = [(i + len(s), i, s) for s in stop if (i := answer.find(s)) != -1]
    if not ends:
        return answer, None
    end, start, string = min(ends, key=lambda match: match[0])
    return answer[: end if params.get("include_stop_str_in_output") else start], string


class PrefixCache:
    """The mock's simulated prefix cache: at most ``capacity`` blocks, least recently used
    forgotten first (see the module docstring)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._blocks: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        #: Prompts looked up, and how many of them had at least one block cached.
        self.lookups = 0
        self.hits = 0

    def lookup(self, words: list[str]) -> int:
        """How many leading words of ``words`` were cached; then every full block of
        them is (most recently used)."""
        blocks = self._blocks
        cached = 0
        missed = False
        digest = b""
        for start in range(0, len(words) - PREFIX_BLOCK_WORDS + 1, PREFIX_BLOCK_WORDS):
            block = " ".join(words[start : start + PREFIX_BLOCK_WORDS]).encode()
            digest = hashlib.blake2b(digest + block, digest_size=16).digest()
            if not missed and digest in blocks:
                cached += PREFIX_BLOCK_WORDS
                blocks.move_to_end(digest)
            else:
                missed = True
                blocks[digest] = None
                if len(blocks) > self.capacity:
                    blocks.popitem(last=False)
        self.lookups += 1
        self.hits += cached > 0
        return cached


class MockBackend:
    """See the module docstring. ``engine_id`` names it in the welcome; ``capabilities``
    (default: every task of :data:`CAPABILITIES`) is what it declares;
    ``allow_fault_injection`` lets requests use the ``mock_*`` knobs; ``prefix_cache``
    (blocks; 0: none) simulates a prefix cache."""

    def __init__(
        self,
        *,
        model: str = "mock",
        tokens_per_second: float = 50.0,
        ttft_ms: float = 20.0,
        engine_id: str = "mock",
        capabilities: list[str] | tuple[str, ...] = CAPABILITIES,
        allow_fault_injection: bool = False,
        prefix_cache: int = 0,
        answer_tokens: int = 0,
    ) -> None:
        #: Tokens after which an answer ends ``stop`` (0: it runs to ``max_tokens``).
        self.answer_tokens = answer_tokens
        self.prefix_cache = PrefixCache(prefix_cache) if prefix_cache > 0 else None
        self.engine_id = engine_id
        self.allow_fault_injection = allow_fault_injection
        self.models = [ModelCard(model)]
        self.capabilities = list(capabilities)
        self.tokens_per_second = tokens_per_second
        self.ttft_ms = ttft_ms

    def _steps(self, request: Submit, params: dict[str, Any]) -> tuple[Sequence[Output], str]:
        """What the request produces, one output per step, and its finish reason."""
        task, inputs = request.task, request.inputs
        if task in TEXT_TASKS:
            requested = params.get("max_tokens")
            max_tokens = DEFAULT_MAX_TOKENS if requested is None else requested
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
                raise RequestError(400, "max_tokens must be a positive integer", "invalid_request")
            if "mock_answer" in params:
                return _scripted(params, requested)
            prompt = prompt_text(request)
            reason = "length"
            if requested is None:
                # Nothing cuts the answer: it ends where the model would end it.
                max_tokens, reason = self.answer_tokens or DEFAULT_MAX_TOKENS, "stop"
            elif self.answer_tokens and self.answer_tokens <= max_tokens:
                max_tokens, reason = self.answer_tokens, "stop"
            # Lazy: a long generation (10 million tokens in the slow-client tests) costs
            # nothing until it runs.
            return _LazyTokens(_prompt_seed(prompt), max_tokens), reason
        prompt = str(inputs.get("prompt", inputs.get("input", "")))
        seed = params.get("seed")
        if task == "speech":
            chunks = speech_chunks(prompt)
            return [Output(c, modality="audio", mime_type=SPEECH_MIME) for c in chunks], "stop"
        if task in ("image_generation", "image_edit"):
            source = media_bytes(inputs.get("image")) if task == "image_edit" else b""
            image = mock_image(prompt, seed, params.get("size"), source)
            return [Output(image, modality="image", mime_type="image/png")], "stop"
        if task == "video_generation":
            frames = params.get("num_frames", VIDEO_FRAMES)
            fps = params.get("fps", VIDEO_FPS)
            if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
                raise RequestError(400, "num_frames must be a positive integer", "invalid_request")
            frames = min(frames, VIDEO_MAX_FRAMES)
            cond = media_bytes(inputs.get("image")) + media_bytes(inputs.get("video"))
            chunks = video_chunks(prompt, seed, frames, fps, cond)
            return [Output(c, modality="video", mime_type="video/mp4") for c in chunks], "stop"
        if task == "embedding":
            return _embedding_steps(inputs, params), "stop"
        raise RequestError(400, f"the mock engine does not do {task!r}", "unsupported_task")

    async def generate(self, request: Submit) -> AsyncIterator[Output]:
        params = request.params
        if not self.allow_fault_injection:
            for name in params:
                if name.startswith(KNOB_PREFIX):
                    raise RequestError(400, FAULT_INJECTION_OFF, "fault_injection_disabled")
        overrides = params.get("mock_by_seed")
        if isinstance(overrides, dict) and isinstance(overrides.get(str(params.get("seed"))), dict):
            params = {**params, **overrides[str(params.get("seed"))]}
        steps, finish_reason = self._steps(request, params)
        rate = _number(params, "mock_tokens_per_second", self.tokens_per_second)
        ttft = _number(params, "mock_ttft_ms", self.ttft_ms) / 1000
        error_after = _optional_int(params, "mock_error_after")
        hang_after = _optional_int(params, "mock_hang_after")
        stall = _number(params, "mock_stall_s", 0)
        queue = _number(params, "mock_queue_ms", 0) / 1000

        cached: int | None = None
        if request.task == "embedding":
            prompt_words = sum(len(text.split()) for text in request.inputs["input"])
            rate = 0.0  # one forward pass: every embedding in the same step
        else:
            words = prompt_text(request).split()
            prompt_words = len(words)
            if self.prefix_cache is not None and request.task in TEXT_TASKS:
                cached = self.prefix_cache.lookup(words)
                if cached:
                    ttft *= 1 - cached / prompt_words * PREFIX_HIT_SAVING
        if stall > 0:
            time.sleep(stall)  # noqa: ASYNC251 - deliberately blocks the engine's loop: a hung engine
        period = 1.0 / rate if rate > 0 else 0.0
        # The mock starts every request at once; mock_queue_ms makes it wait first, as
        # in a scheduler's queue. Either way it reports the wait (OutputItem.queue_time).
        arrived = time.monotonic()
        if queue > 0:
            await _sleep(queue)
        queued = time.monotonic() - arrived
        await _sleep(ttft)
        for index in range(len(steps)):
            step = steps[index]
            if index and period:
                # Align to the engine-wide step grid so concurrent requests share steps.
                await _next_step(period)
            if hang_after is not None and index >= hang_after:
                await _sleep_forever()
            if error_after is not None and index >= error_after:
                raise RequestError(
                    int(params.get("mock_error_status", 500)),
                    str(params.get("mock_error_message", "mock engine failure")),
                )
            if index == len(steps) - 1:
                step = attrs.evolve(
                    step,
                    usage=Usage(
                        prompt_words, 0 if request.task == "embedding" else len(steps), cached
                    ),
                    finish_reason=finish_reason,
                    queue_time=queued,
                )
            yield step
