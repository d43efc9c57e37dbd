"""The routing policies, on stand-ins for engine connections (no sockets)."""

from __future__ import annotations

import collections

import attrs
import pytest

from trioserve.engine.routing import (
    PREFIX_CHARS,
    Affinity,
    LeastLoad,
    affinity_key,
    make_policy,
    prompt_prefix,
)
from trioserve.protocol import Submit


@attrs.define(eq=False)
class Engine:
    address: str
    load: int = 0
    kv_cache_usage: float | None = None


def engines(count: int) -> list[Engine]:
    return [Engine(f"tcp://10.0.0.{i}:5555") for i in range(1, count + 1)]


def chat(text: str, user: str | None = None) -> Submit:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]
    return Submit("r", "m", "chat", {"messages": messages}, session_key=user)


def test_least_load_takes_the_fewest_requests_then_the_emptiest_kv_cache():
    a, b, c = engines(3)
    a.load, b.load, c.load = 3, 1, 1
    b.kv_cache_usage, c.kv_cache_usage = 0.7, 0.2
    assert LeastLoad().choose([a, b, c], chat("x")) is c
    c.load = 2
    assert LeastLoad().choose([a, b, c], chat("x")) is b


def test_affinity_sends_a_session_to_one_engine_whatever_its_prompts():
    pool = engines(4)
    policy = Affinity()
    chosen = {policy.choose(pool, chat(f"question {i}", user="alice")) for i in range(20)}
    assert len(chosen) == 1


def test_affinity_without_a_session_keys_on_the_prompt_prefix():
    pool = engines(4)
    policy = Affinity()
    shared = "You are a support agent for ACME. " * 20  # longer than PREFIX_CHARS
    chosen = {policy.choose(pool, chat(shared + f"question {i}")) for i in range(20)}
    assert len(chosen) == 1
    # Different prefixes spread over the engines.
    spread = collections.Counter(policy.choose(pool, chat(f"{i} hello")) for i in range(400))
    assert len(spread) == 4 and min(spread.values()) > 50


def test_affinity_spills_a_key_to_its_next_engine_when_its_own_is_over_the_bound():
    pool = engines(3)
    policy = Affinity(load_factor=1.25)
    home = policy.choose(pool, chat("x", user="bob"))
    home.load = 10  # the others idle: the bound is ceil(1.25 * 11 / 3) = 5
    spill = policy.choose(pool, chat("x", user="bob"))
    assert spill is not home
    # Always the same next engine (its ranking), not whichever is least loaded.
    others = [e for e in pool if e is not home and e is not spill]
    others[0].load = 0
    spill.load = 3
    assert policy.choose(pool, chat("x", user="bob")) is spill
    home.load = 1  # back within the bound: home again
    assert policy.choose(pool, chat("x", user="bob")) is home


def test_affinity_moves_only_the_keys_of_an_engine_that_left():
    pool = engines(5)
    policy = Affinity()
    keys = [f"user-{i}" for i in range(300)]
    before = {k: policy.choose(pool, chat("x", user=k)) for k in keys}
    gone = pool[2]
    after = {k: policy.choose([e for e in pool if e is not gone], chat("x", user=k)) for k in keys}
    moved = [k for k in keys if before[k] is not after[k]]
    assert moved and all(before[k] is gone for k in moved)


def test_affinity_ranks_by_address_so_frontends_agree():
    # Two frontends hold their own connection objects for the same addresses.
    first, second = engines(4), engines(4)
    policy = Affinity()
    for i in range(50):
        message = chat("x", user=f"u{i}")
        assert policy.choose(first, message).address == policy.choose(second, message).address


def test_the_affinity_key_is_the_session_else_the_prompt_start():
    assert affinity_key(chat("a", user="alice")) == affinity_key(chat("b", user="alice"))
    assert affinity_key(chat("a")) != affinity_key(chat("b"))
    long = "w" * (PREFIX_CHARS * 2)
    assert affinity_key(chat(long + "a")) == affinity_key(chat(long + "b"))
    completion = Submit("r", "m", "completion", {"prompt": "hello world"})
    assert prompt_prefix(completion.inputs, 5) == "hello"


def test_prompt_prefix_reads_chat_text_parts_and_skips_media():
    inputs = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image"}]},
            "not a message",
            {"role": "assistant", "content": None},
        ]
    }
    assert prompt_prefix(inputs, 100) == "user\nlook\nassistant"
    assert prompt_prefix({"messages": "odd"}, 100) == ""
    assert prompt_prefix({}, 100) == ""


def test_policies_by_name():
    assert isinstance(make_policy("least-load"), LeastLoad)
    assert make_policy("affinity", load_factor=2.0).load_factor == 2.0  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="unknown routing policy"):
        make_policy("random")
    with pytest.raises(ValueError, match="at least 1"):
        Affinity(0.5)
