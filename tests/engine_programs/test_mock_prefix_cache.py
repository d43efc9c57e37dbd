"""The mock engine's simulated prefix cache: hits reported in usage, bounded, least
recently used blocks forgotten first."""

from __future__ import annotations

import pytest

from trioserve.engine_programs.mock import PREFIX_BLOCK_WORDS, MockBackend, PrefixCache
from trioserve.protocol import Submit

BLOCK = PREFIX_BLOCK_WORDS


def words(tag: str, count: int) -> list[str]:
    return [f"{tag}{i}" for i in range(count)]


def test_the_leading_blocks_seen_before_are_hits():
    cache = PrefixCache(capacity=100)
    system = words("s", 2 * BLOCK)
    assert cache.lookup(system + words("q", BLOCK)) == 0
    # The same two blocks, another question: 2 blocks cached, the question is not.
    assert cache.lookup(system + words("other", BLOCK)) == 2 * BLOCK
    # A block is known by everything before it too: the same words after another start
    # are not a hit.
    assert cache.lookup(words("x", BLOCK) + system) == 0
    # A partial last block is never cached.
    assert cache.lookup(words("p", BLOCK - 1)) == 0
    assert cache.lookup(words("p", BLOCK - 1)) == 0
    assert (cache.lookups, cache.hits) == (5, 1)


def test_the_cache_holds_its_capacity_and_forgets_the_least_recently_used():
    cache = PrefixCache(capacity=2)
    a, b, c = words("a", BLOCK), words("b", BLOCK), words("c", BLOCK)
    cache.lookup(a)
    cache.lookup(b)
    assert cache.lookup(a) == BLOCK  # a is now the most recently used
    cache.lookup(c)  # evicts b
    assert len(cache._blocks) == 2
    assert cache.lookup(a) == BLOCK
    assert cache.lookup(b) == 0


def request(prompt: str) -> Submit:
    return Submit("r", "mock", "completion", {"prompt": prompt}, {"max_tokens": 1})


async def answer(backend: MockBackend, prompt: str):
    [output] = [out async for out in backend.generate(request(prompt))]
    return output.usage


async def test_usage_reports_cached_prompt_tokens_only_with_a_cache():
    prompt = " ".join(words("w", 3 * BLOCK + 5))
    cached = MockBackend(ttft_ms=0, prefix_cache=64)
    assert (await answer(cached, prompt)).cached_tokens == 0
    usage = await answer(cached, prompt)
    assert usage.cached_tokens == 3 * BLOCK and usage.prompt_tokens == 3 * BLOCK + 5
    assert (await answer(MockBackend(ttft_ms=0), prompt)).cached_tokens is None


@pytest.mark.parametrize("cached_share", [0.0, 0.5, 1.0])
async def test_a_hit_shortens_the_wait_for_the_first_token(monkeypatch, cached_share):
    # The wait the mock asks for, not a measured time: ttft * (1 - share * saving).
    from trioserve.engine_programs import mock

    waits: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(mock, "_sleep", fake_sleep)
    backend = MockBackend(ttft_ms=100, prefix_cache=64)
    prompt_words = words("w", 4 * BLOCK)
    cached_blocks = int(4 * cached_share)
    backend.prefix_cache.lookup(prompt_words[: cached_blocks * BLOCK])
    await answer(backend, " ".join(prompt_words))
    assert waits == [pytest.approx(0.1 * (1 - cached_share * mock.PREFIX_HIT_SAVING))]
