"""The mock engine's embeddings: deterministic, of unit length, shortened on request."""

from __future__ import annotations

import hashlib
import math
import struct

import pytest

from trioserve.engine_programs.mock import EMBEDDING_DIMENSIONS, MockBackend, mock_embedding
from trioserve.protocol import Submit
from trioserve.sdk.core import RequestError


def unpack(packed: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(packed) // 4}f", packed))


def test_the_vector_is_the_documented_function_of_the_text():
    raw = hashlib.shake_256("héllo".encode()).digest(2 * EMBEDDING_DIMENSIONS)
    values = [u / 32767.5 - 1 for (u,) in struct.iter_unpack("<H", raw)]
    norm = math.sqrt(sum(v * v for v in values))
    expected = [v / norm for v in values]
    got = unpack(mock_embedding("héllo"))
    assert len(got) == EMBEDDING_DIMENSIONS
    pairs = zip(got, expected, strict=True)
    assert all(math.isclose(g, e, rel_tol=1e-6, abs_tol=1e-7) for g, e in pairs)
    assert mock_embedding("héllo") == mock_embedding("héllo")
    assert mock_embedding("hello") != mock_embedding("héllo")


@pytest.mark.parametrize("dimensions", [1, 3, EMBEDDING_DIMENSIONS])
def test_fewer_dimensions_keep_the_first_ones_rescaled_to_unit_length(dimensions):
    full = unpack(mock_embedding("abc"))
    short = unpack(mock_embedding("abc", dimensions))
    assert len(short) == dimensions
    assert math.isclose(math.fsum(v * v for v in short), 1.0, rel_tol=1e-5)
    scale = short[0] / full[0]
    pairs = zip(short, full[:dimensions], strict=True)
    assert all(math.isclose(s, f * scale, rel_tol=1e-5) for s, f in pairs)


async def collect(backend: MockBackend, submit: Submit) -> list:
    return [output async for output in backend.generate(submit)]


async def test_one_item_per_input_the_last_with_usage_and_stop():
    backend = MockBackend(ttft_ms=0)
    submit = Submit("r", "mock", "embedding", {"input": ["a b", "c"]}, {"dimensions": 2})
    outputs = await collect(backend, submit)
    assert [o.data for o in outputs] == [mock_embedding("a b", 2), mock_embedding("c", 2)]
    assert {o.modality for o in outputs} == {"embedding"}
    assert outputs[-1].finish_reason == "stop"
    assert (outputs[-1].usage.prompt_tokens, outputs[-1].usage.completion_tokens) == (3, 0)


@pytest.mark.parametrize(
    ("inputs", "params"),
    [
        ({"input": "not a list"}, {}),
        ({"input": ["a", 5]}, {}),
        ({"input": ["a"]}, {"dimensions": 0}),
        ({"input": ["a"]}, {"dimensions": EMBEDDING_DIMENSIONS + 1}),
        ({"input": ["a"]}, {"dimensions": True}),
    ],
)
async def test_what_it_cannot_embed_is_a_400(inputs, params):
    with pytest.raises(RequestError) as caught:
        await collect(MockBackend(ttft_ms=0), Submit("r", "mock", "embedding", inputs, params))
    assert caught.value.status == 400
