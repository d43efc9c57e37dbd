"""vLLM's EngineCore wire format, mirrored by hand; sans-io (no trio, no zmq).

Each struct below names the vLLM 0.32 definition it mirrors; ``tests/vllm/test_enginecore_
codec.py`` holds every one to the installed vLLM's own structs and encoder, both ways, so a
vLLM release that moves a field fails a test rather than a user.

Why msgspec and not msgpack (which trioserve's own protocol uses): vLLM encodes these
structs with msgspec, and msgspec reproduces its encoding exactly (array-like structs,
omitted map defaults, sets as arrays, extension type 3 for raw array bytes). The outputs
frame is decoded once per engine step for every request in the batch, the per-token path:
msgspec decodes it straight into typed structs in C, checking types as it goes, for what
msgpack takes to build bare lists (``tools/bench_enginecore_codec.py``; docs/benchmarks.md).

Shapes on the wire (msgpack):

- ``EngineCoreRequest``, ``EngineCoreOutputs``, ``EngineCoreOutput``, ``UtilityOutput`` are
  positional arrays (``array_like``): every field is written, and a decoder accepts arrays
  shorter (trailing fields take their defaults) or longer (later fields ignored) than it
  knows, since vLLM only ever appends fields.
- ``SamplingParams`` (its defaults omitted), the stats dataclasses, the ready response and
  the handshake messages are maps keyed by field name, underscore fields included.
- An array (numpy or torch) is ``[dtype, shape, data]``: ``data`` is the raw bytes as
  extension type 3, or, for one of 256 bytes and more, the index of an extra frame of the
  message holding them (:class:`WireArray`).
"""

from __future__ import annotations

import enum
import math
import sys
from collections.abc import Sequence
from typing import Any

import msgspec

from ..errors import EngineLostError, PeerProtocolError, ProtocolVersionError

#: The vLLM releases (``major.minor``) whose structs this module mirrors.
SUPPORTED_VLLM_VERSIONS = ("0.32",)


def vllm_version_supported(version: str) -> bool:
    """Whether an engine reporting ``version`` (e.g. ``0.32.0``, ``0.32.1+cpu``) speaks the
    wire format mirrored here."""
    return any(version == v or version.startswith(v + ".") for v in SUPPORTED_VLLM_VERSIONS)


class RequestType(bytes, enum.Enum):
    """The first frame of a client → engine message (``vllm.v1.engine.
    EngineCoreRequestType``)."""

    ADD = b"\x00"
    ABORT = b"\x01"
    START_DP_WAVE = b"\x02"
    UTILITY = b"\x03"


#: The single frame EngineCore pushes to every client when its busy loop dies of an error
#: (``EngineCoreProc.ENGINE_CORE_DEAD``). A killed engine sends nothing.
ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"


class FinishReason(enum.IntEnum):
    """``vllm.v1.engine.FinishReason``; the names are vLLM's ``FINISH_REASON_STRINGS``."""

    STOP = 0  # an EOS or stop token (stop strings are the client's)
    LENGTH = 1  # max_tokens, or max_model_len
    ABORT = 2
    ERROR = 3  # a request-level engine error: a 500 in vLLM's own server
    REPETITION = 4


FINISH_REASON_NAMES = ("stop", "length", "abort", "error", "repetition")


def finish_reason_name(reason: int) -> str:
    """vLLM's name of a finish reason off the wire; ``"error"`` for one it does not know."""
    names = FINISH_REASON_NAMES
    return names[reason] if 0 <= reason < len(names) else "error"


#: ``vllm.v1.serial_utils.CUSTOM_TYPE_RAW_VIEW``: raw bytes of an array, inline.
EXT_RAW_VIEW = 3


# -- arrays --------------------------------------------------------------------------------

# numpy's dtype.str (ndarrays) and torch's dtype names (tensors) → struct format.
_FORMATS = {
    "<i4": "i",
    "<i8": "q",
    "<f4": "f",
    "<f8": "d",
    "|b1": "?",
    "|u1": "B",
    "int32": "i",
    "int64": "q",
    "float32": "f",
    "float64": "d",
    "bool": "?",
    "uint8": "B",
}


class WireArray(msgspec.Struct, array_like=True, gc=False):
    """An ndarray or tensor as vLLM's ``MsgpackEncoder._encode_ndarray`` / ``_encode_tensor``
    write it: ``data`` is the raw bytes (extension type 3), or an ``int``: the index of the
    message's frame that holds them (:func:`resolve_arrays` swaps the frame in)."""

    dtype: str
    shape: list[int]
    data: Any

    @classmethod
    def of(cls, fmt: str, shape: Sequence[int], values: Sequence[Any]) -> WireArray:
        """An array of ``values`` (row-major) in struct format ``fmt`` (``"i"``, ``"q"``,
        ``"f"``), as numpy names its dtype (what vLLM's decoder accepts for ndarrays)."""
        import array

        if sys.byteorder != "little":  # pragma: no cover - vLLM's wire is little-endian
            raise NotImplementedError("big-endian hosts")
        dtype = {"i": "<i4", "q": "<i8", "f": "<f4", "d": "<f8"}[fmt]
        raw = array.array(fmt, values).tobytes()
        return cls(dtype, list(shape), msgspec.msgpack.Ext(EXT_RAW_VIEW, raw))

    def tolist(self) -> list[Any]:
        """The values, nested as ``shape`` says (a 1-d or 2-d list)."""
        fmt = _FORMATS.get(self.dtype)
        if fmt is None:
            raise PeerProtocolError(f"an array of dtype {self.dtype!r} (not one vLLM sends)")
        if isinstance(self.data, int):
            raise PeerProtocolError("an array whose frame was not resolved")
        view: Any = memoryview(self.data).cast("B")  # Any: the format is only known here
        if len(self.shape) > 1 and math.prod(self.shape) == 0:
            return [[] for _ in range(self.shape[0])]
        try:
            return view.cast(fmt, self.shape).tolist() if self.shape else [view.cast(fmt)[0]]
        except (TypeError, ValueError) as exc:
            raise PeerProtocolError(f"an array that does not fit its shape: {exc}") from None


def _ext_hook(code: int, data: memoryview) -> Any:
    if code == EXT_RAW_VIEW:
        return bytes(data)  # a copy: the frame it views is not ours to keep
    # 1 and 2 are pickles, which vLLM sends only with VLLM_ALLOW_INSECURE_SERIALIZATION.
    raise PeerProtocolError(f"msgpack extension type {code} (only {EXT_RAW_VIEW} is expected)")


# -- client → engine -----------------------------------------------------------------------


class StructuredOutputsParams(msgspec.Struct, gc=False):
    """``vllm.sampling_params.StructuredOutputsParams`` (a dataclass: a map of every field).
    ``_backend`` must name the backend (``xgrammar``, ``guidance``, ``outlines``,
    ``lm-format-enforcer``): the engine answers an empty one with an ERROR output."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None
    _backend: str | None = None
    _backend_was_auto: bool = False


class RepetitionDetectionParams(msgspec.Struct, gc=False):
    """``vllm.sampling_params.RepetitionDetectionParams`` (a dataclass)."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0


class SamplingParams(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, gc=False):
    """``vllm.sampling_params.SamplingParams``: a map of the fields that differ from these
    defaults (vLLM's), underscore fields included.

    The engine builds vLLM's own ``SamplingParams`` from this map *and validates it there*,
    outside its error handling: a value its checks refuse kills the engine's input thread.
    Everything here must have passed the text layer's validation first.
    """

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    watermarking: bool | None = None
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16  # vLLM's wire default: always set it
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    prompt_logprob_token_ids: WireArray | None = None
    prompt_logprob_start: int | None = None
    logprob_token_ids: list[int] | None = None
    flat_logprobs: bool = False
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: int = 0  # RequestOutputKind.CUMULATIVE; the engine does not read it
    stream_interval: int | None = None
    skip_clone: bool = False
    output_text_buffer_length: int = 0
    _eos_token_id: int | None = None
    _all_stop_token_ids: set[int] = msgspec.field(default_factory=set)
    _watermarking_skipped: bool = False
    structured_outputs: StructuredOutputsParams | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    extra_args: dict[str, Any] | None = None
    bad_words: list[str] | None = None
    _bad_words_token_ids: list[list[int]] | None = None
    skip_reading_prefix_cache: bool | None = None
    thinking_token_budget: int | None = None
    repetition_detection: RepetitionDetectionParams | None = None
    routed_experts_prompt_start: int = 0
    trace_decode_token_ids: list[int] | None = None


def sampling_params(fields: dict[str, Any]) -> SamplingParams:
    """The struct of a map keyed by vLLM's field names (the text layer's lowering), its
    types checked: a wrong type raises ``ValueError`` naming the field, here, where the
    engine would have wedged on it."""
    try:
        return msgspec.convert(fields, SamplingParams)
    except msgspec.ValidationError as exc:
        raise ValueError(f"sampling parameters: {exc}") from None


class EngineCoreRequest(msgspec.Struct, array_like=True, gc=False):
    """``vllm.v1.engine.EngineCoreRequest``: the payload of an ADD, all 22 fields of 0.32
    in order. The first nine have no default on vLLM's side and must be present."""

    request_id: str  # unique across every client of the engine
    prompt_token_ids: list[int] | None
    mm_features: Any  # list[MultiModalFeatureSpec] | None: always None here
    sampling_params: SamplingParams | None
    pooling_params: Any  # PoolingParams | None: always None here
    arrival_time: float  # wall clock (time.time()), for vLLM's queue-time metrics
    lora_request: Any  # LoRARequest | None: always None here
    cache_salt: str | None
    data_parallel_rank: int | None
    prompt_embeds: Any = None  # torch.Tensor | None
    prompt_is_token_ids: list[bool] | None = None
    client_index: int = 0  # which of the engine's output sockets answers
    current_wave: int = 0  # data-parallel waves; 0 without a coordinator
    priority: int = 0  # lower runs first, under --scheduling-policy priority
    trace_headers: dict[str, str] | None = None
    resumable: bool = False
    external_req_id: str | None = None
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: dict[str, Any] | None = None
    abort_immediately: bool = False
    session_id: str | None = None
    kv_hints: Any = None  # KvHintsEnvelope | None


_encoder = msgspec.msgpack.Encoder()


def encode_add(request: EngineCoreRequest) -> list[bytes]:
    """An ADD message, after the engine's identity frame."""
    return [RequestType.ADD.value, _encoder.encode(request)]


_request_decoder = msgspec.msgpack.Decoder(EngineCoreRequest, ext_hook=_ext_hook)


def decode_request(frames: Sequence[bytes | memoryview]) -> EngineCoreRequest:
    """An ADD's payload (the frames after the type), as the engine would read it: for
    tests, and for an engine written against this module."""
    try:
        return _request_decoder.decode(frames[0])
    except msgspec.DecodeError as exc:
        raise PeerProtocolError(f"not an EngineCoreRequest: {exc}") from None


def encode_abort(request_ids: Sequence[str]) -> list[bytes]:
    """An ABORT of these requests (the engine answers nothing; unknown ids are ignored)."""
    return [RequestType.ABORT.value, _encoder.encode(list(request_ids))]


def encode_utility(
    client_index: int, call_id: int, method: str, args: Sequence[Any]
) -> list[bytes]:
    """A UTILITY call of EngineCore's ``method(*args)``, answered in the ``utility_output``
    of an outputs message on this client's output socket."""
    return [RequestType.UTILITY.value, _encoder.encode((client_index, call_id, method, list(args)))]


# -- engine → client -----------------------------------------------------------------------


class Logprobs(msgspec.Struct, array_like=True, gc=False):
    """``vllm.v1.outputs.LogprobsLists`` (a NamedTuple of ndarrays): per generated token,
    the sampled token and the top ones (``[positions, 1 + num_logprobs]``, the sampled token
    first), their logprobs, and the sampled token's rank."""

    logprob_token_ids: WireArray
    logprobs: WireArray
    sampled_token_ranks: WireArray
    cu_num_generated_tokens: list[int] | None = None

    def rows(self) -> tuple[list[Any], list[Any], list[Any]]:
        """Per generated token: its and the top tokens' ids, their logprobs, its rank
        (the text layer's ``LogprobRows``)."""
        return (
            self.logprob_token_ids.tolist(),
            self.logprobs.tolist(),
            self.sampled_token_ranks.tolist(),
        )


class PromptLogprobs(msgspec.Struct, array_like=True, gc=False):
    """``vllm.v1.outputs.LogprobsTensors`` (torch tensors), for prompt logprobs."""

    logprob_token_ids: WireArray
    logprobs: WireArray
    selected_token_ranks: WireArray
    cu_num_generated_tokens: list[int] | None = None
    cu_num_generated_tokens_tensor: WireArray | None = None

    def rows(self) -> tuple[list[Any], list[Any], list[Any]]:
        """Per prompt position after the first: its and the top tokens' ids, their
        logprobs, its rank (the text layer's ``LogprobRows``)."""
        return (
            self.logprob_token_ids.tolist(),
            self.logprobs.tolist(),
            self.selected_token_ranks.tolist(),
        )


class EngineCoreEvent(msgspec.Struct, gc=False):
    """``vllm.v1.engine.EngineCoreEvent`` (a map): 1 queued, 2 scheduled, 3 preempted, at a
    monotonic time of the engine's clock (comparable only with the engine's)."""

    type: int
    timestamp: float


class PrefillStats(msgspec.Struct, gc=False):
    """``vllm.v1.metrics.stats.PrefillStats`` (a dataclass), on a request's first output."""

    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_local_cached_tokens: int = 0
    num_external_cached_tokens: int = 0
    num_cache_creation_tokens: int = 0


class EngineCoreOutput(msgspec.Struct, array_like=True, gc=False):
    """``vllm.v1.engine.EngineCoreOutput``: one request's delta of one step (18 fields in
    0.32). A stop token is included in ``new_token_ids``."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: Logprobs | None = None
    new_prompt_logprobs_tensors: PromptLogprobs | None = None
    pooling_output: Any = None
    finish_reason: int | None = None  # FinishReason; an int so a new reason is not fatal
    stop_reason: int | str | None = None  # the stop token id; None for EOS
    events: list[EngineCoreEvent] | None = None
    kv_transfer_params: Any = None
    ec_transfer_params: Any = None
    trace_headers: Any = None
    prefill_stats: PrefillStats | None = None
    routed_experts: Any = None
    num_nans_in_logits: int = 0
    mm_cache_miss_hashes: Any = None
    new_sampling_mask: Any = None
    spec_decode_metrics: Any = None
    prompt_token_id_logprobs: Any = None


class PrefixCacheStats(msgspec.Struct, gc=False):
    """``vllm.v1.metrics.stats.PrefixCacheStats``: this step's prefix-cache lookups."""

    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0


class SchedulerStats(msgspec.Struct, gc=False):
    """``vllm.v1.metrics.stats.SchedulerStats`` (a dataclass, a map): the figures routing
    and ``/metrics`` read. The engine sends them with a step's outputs unless it runs with
    ``--disable-log-stats``. Fields not named here are skipped when decoding."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_skipped_waiting_reqs: int = 0
    step_counter: int = 0
    current_wave: int = 0
    kv_cache_usage: float = 0.0  # a fraction, 0 to 1
    prefix_cache_stats: PrefixCacheStats = msgspec.field(default_factory=PrefixCacheStats)


class UtilityOutput(msgspec.Struct, array_like=True, gc=False):
    """``vllm.v1.engine.UtilityOutput``: the answer to one UTILITY call. ``result`` is
    ``[type_info, value]`` (``vllm.v1.serial_utils.UtilityResult``; type_info is None unless
    the engine allows pickles)."""

    call_id: int
    failure_message: str | None = None
    result: Any = None

    @property
    def value(self) -> Any:
        if self.result is None:
            return None
        try:
            _type_info, value = self.result
        except (TypeError, ValueError):
            raise PeerProtocolError("a utility result that is not [type_info, value]") from None
        return value


class EngineCoreOutputs(msgspec.Struct, array_like=True, gc=False):
    """``vllm.v1.engine.EngineCoreOutputs``: one message on a client's output socket."""

    engine_index: int = 0
    outputs: list[EngineCoreOutput] = []
    scheduler_stats: SchedulerStats | None = None
    timestamp: float = 0.0  # the engine's monotonic clock
    utility_output: UtilityOutput | None = None
    finished_requests: list[str] | None = None  # a set on vLLM's side
    wave_complete: int | None = None
    start_wave: int | None = None
    weight_version: str | None = None


_outputs_decoder = msgspec.msgpack.Decoder(EngineCoreOutputs, ext_hook=_ext_hook)


def decode_outputs(frames: Sequence[bytes | memoryview]) -> EngineCoreOutputs:
    """One message from the output socket, its arrays' extra frames swapped in. Raises
    :class:`EngineLostError` for the death frame, :class:`PeerProtocolError` for anything that is
    not an ``EngineCoreOutputs`` of this wire format."""
    first = frames[0]
    if first == ENGINE_CORE_DEAD:
        raise EngineLostError("the engine reported ENGINE_CORE_DEAD (its busy loop died)")
    try:
        message = _outputs_decoder.decode(first)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise PeerProtocolError(f"not an EngineCoreOutputs message: {exc}") from None
    if len(frames) > 1:
        resolve_arrays(message, frames)
    return message


def resolve_arrays(message: EngineCoreOutputs, frames: Sequence[bytes | memoryview]) -> None:
    """Put the extra frames of a message in place of the indices its arrays hold."""
    for output in message.outputs:
        sampled = output.new_logprobs
        if sampled is not None:
            for array in (sampled.logprob_token_ids, sampled.logprobs, sampled.sampled_token_ranks):
                _resolve(array, frames)
        prompt = output.new_prompt_logprobs_tensors
        if prompt is not None:
            for array in (prompt.logprob_token_ids, prompt.logprobs, prompt.selected_token_ranks):
                _resolve(array, frames)


def _resolve(array: WireArray, frames: Sequence[bytes | memoryview]) -> None:
    if isinstance(array.data, int):
        if not 0 < array.data < len(frames):
            raise PeerProtocolError(f"an array in frame {array.data} of {len(frames)}")
        array.data = frames[array.data]


# -- handshake and registration ------------------------------------------------------------


class EngineHello(msgspec.Struct, gc=False):
    """What the engine sends on the handshake socket (``EngineCoreProc.startup_handshake``
    and ``_perform_handshake``): ``HELLO`` on connecting, ``READY`` once its input and output
    threads run (after the ready response on the input socket, or before it)."""

    status: str
    local: bool
    headless: bool
    parallel_config_hash: str | None = None


class EngineAddresses(msgspec.Struct, gc=False):
    """``vllm.v1.engine.utils.EngineZmqAddresses``: one input and one output address per
    client; ``client_index`` of a request indexes both lists."""

    inputs: list[str]
    outputs: list[str]
    coordinator_input: str | None = None
    coordinator_output: str | None = None
    frontend_stats_publish_address: str | None = None


class HandshakeInit(msgspec.Struct, gc=False):
    """``vllm.v1.engine.utils.EngineHandshakeMetadata``: the client's answer to HELLO.
    ``parallel_config`` is empty without data-parallel coordination."""

    addresses: EngineAddresses
    parallel_config: dict[str, Any]


class EngineCoreReadyResponse(msgspec.Struct, gc=False):
    """``vllm.v1.engine.EngineCoreReadyResponse`` (a dataclass, a map): the engine's first
    message on each input socket, once the model is loaded. ``max_model_len`` is the one
    after KV-cache auto-fitting."""

    max_model_len: int
    num_gpu_blocks: int
    block_size: int
    dp_stats_address: str | None
    dtype: str
    vllm_version: str
    world_size: int
    data_parallel_size: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    decode_context_parallel_size: int
    data_parallel_rank: int
    max_num_seqs: int
    max_num_batched_tokens: int
    instance_id: str
    supports_lora: bool
    max_loras: int
    mamba_block_size: int | None = None
    kv_cache_size_tokens: int | None = None
    kv_cache_max_concurrency: float | None = None
    kv_events_config: Any = None
    weight_transfer_backend: str | None = None
    enable_sleep_mode: bool = False
    supports_draft_weight_updates: bool = False
    effective_attention_block_size: int | None = None


_hello_decoder = msgspec.msgpack.Decoder(EngineHello)


def decode_hello(payload: bytes) -> EngineHello:
    try:
        return _hello_decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise PeerProtocolError(f"not a vLLM handshake message: {exc}") from None


def encode_init(inputs: Sequence[str], outputs: Sequence[str]) -> bytes:
    """The INIT answer to HELLO: the addresses the engine connects to, one pair a client."""
    return _encoder.encode(HandshakeInit(EngineAddresses(list(inputs), list(outputs)), {}))


def decode_ready_response(payload: bytes) -> EngineCoreReadyResponse:
    """The registration frame on the input socket. A frame that is not one (another
    version's, or not vLLM's) raises :class:`PeerProtocolError` saying what it holds."""
    try:
        fields = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise PeerProtocolError(f"not a vLLM ready response: {exc}") from None
    if isinstance(fields, dict) and "vllm_version" in fields:
        # Check the version before the fields: another release may have moved them.
        version = str(fields["vllm_version"])
        if not vllm_version_supported(version):
            raise ProtocolVersionError(unsupported_version(version))
    try:
        return msgspec.convert(fields, EngineCoreReadyResponse)
    except msgspec.ValidationError as exc:
        raise PeerProtocolError(f"not a vLLM ready response: {exc}") from None


def encode_ready_response(ready: EngineCoreReadyResponse) -> bytes:
    """The registration frame, as the engine sends it (for another client of the engine,
    which reads it with :func:`decode_ready_response`)."""
    return _encoder.encode(ready)


def unsupported_version(version: str) -> str:
    """The one line that refuses an engine of another vLLM release."""
    supported = ", ".join(f"{v}.x" for v in SUPPORTED_VLLM_VERSIONS)
    return f"the engine is vLLM {version}; this trioserve speaks to vLLM {supported} only"
