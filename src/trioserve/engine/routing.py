"""Which engine a request goes to: the routing policies (``--routing``).

Both policies choose among the engines that can take the request now: ready, serving its
model and task, not draining, not being let go of (``EngineLink.accepting``, see
:mod:`~trioserve.engine.link`). An engine's load is ``EngineLink.load``: the requests it
reported running and waiting in its last figures (every frontend's), plus what this
frontend started there since, less what ended; ties go to the emptier KV cache where
engines report one. Both are read over the link interface, whatever the engine speaks.

- :class:`LeastLoad` (``least-load``, the default): the least loaded engine.
- :class:`Affinity` (``affinity``): requests with the same key go to the same engine, so an
  engine that caches prompt prefixes (vLLM, SGLang) finds theirs again. The key is the
  request's session (:attr:`Submit.session_key <trioserve.protocol.Submit.session_key>`:
  the ``X-Session-Id`` header, else the body's ``user``), or else the start of its prompt
  (:data:`PREFIX_CHARS` characters). Each key ranks the engines by a hash of key and
  engine address (rendezvous hashing: when an engine comes or goes, only the keys it
  ranked first move), and takes the first whose load stays within the bound of bounded-load
  consistent hashing (Mirrokni, Thorup and Zadimoghaddam, 2018): at most ``load_factor``
  times the mean load, counting this request. The least loaded engine is always within
  it, so a key whose engine is busy spills to the next in its ranking, never to a
  random one. Frontends that see the same engine addresses rank them the same way.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..protocol import Submit

if TYPE_CHECKING:
    from .link import EngineLink

#: Characters of the prompt that make a request's affinity key when it has no session.
PREFIX_CHARS = 256
#: ``--affinity-load-factor``: an engine keeps its keys while its load (with the new
#: request) is at most this many times the mean load of the engines that could serve it.
DEFAULT_LOAD_FACTOR = 1.25

POLICIES = ("least-load", "affinity")


class Policy(Protocol):
    def choose(self, candidates: Sequence[EngineLink], message: Submit) -> EngineLink:
        """One of ``candidates`` (never empty) for ``message``."""
        ...


def _load(conn: EngineLink) -> tuple[int, float]:
    # Fewest requests at the engine first, then the emptiest KV cache.
    return conn.load, conn.kv_cache_usage or 0.0


class LeastLoad:
    """The least loaded engine (running + waiting requests, then KV-cache use)."""

    def choose(self, candidates: Sequence[EngineLink], message: Submit) -> EngineLink:
        best = candidates[0]
        if len(candidates) > 1:
            best_load = _load(best)
            for conn in candidates[1:]:
                load = _load(conn)
                if load < best_load:
                    best, best_load = conn, load
        return best


class Affinity:
    """The same key to the same engine while its load is within a bound (module
    docstring)."""

    def __init__(self, load_factor: float = DEFAULT_LOAD_FACTOR) -> None:
        if load_factor < 1:
            raise ValueError(f"the affinity load factor must be at least 1, got {load_factor}")
        self.load_factor = load_factor

    def choose(self, candidates: Sequence[EngineLink], message: Submit) -> EngineLink:
        if len(candidates) == 1:
            return candidates[0]
        key = affinity_key(message)
        loads = [conn.load for conn in candidates]
        bound = math.ceil(self.load_factor * (sum(loads) + 1) / len(candidates))
        ranked = sorted(
            range(len(candidates)), key=lambda i: _weight(key, candidates[i].address), reverse=True
        )
        for i in ranked:
            if loads[i] + 1 <= bound:
                return candidates[i]
        return LeastLoad().choose(candidates, message)  # (cannot happen: see the docstring)


def _weight(key: bytes, address: str) -> bytes:
    """The rendezvous weight of ``address`` for ``key``: the same in every frontend
    (Python's own ``hash`` is salted per process)."""
    return hashlib.blake2b(key + b"\0" + address.encode(), digest_size=8).digest()


def affinity_key(message: Submit) -> bytes:
    """The request's session key, else the first :data:`PREFIX_CHARS` of its prompt."""
    if message.session_key:
        return b"s:" + message.session_key.encode()
    return b"p:" + prompt_prefix(message.inputs, PREFIX_CHARS).encode()


def prompt_prefix(inputs: dict[str, Any], limit: int) -> str:
    """The first ``limit`` characters of a request's text: ``prompt`` or ``input``, or
    the text of its chat messages in order (roles included, media left out)."""
    for name in ("prompt", "input"):
        value = inputs.get(name)
        if isinstance(value, str):
            return value[:limit]
    parts: list[str] = []
    size = 0
    for message in inputs.get("messages") or ():
        if size >= limit:
            break
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        texts = [content] if isinstance(content, str) else []
        if isinstance(content, list):
            texts = [
                part["text"]
                for part in content
                if isinstance(part, dict) and isinstance(part.get("text"), str)
            ]
        for text in (str(message.get("role")), *texts):
            parts.append(text)
            size += len(text) + 1
    return "\n".join(parts)[:limit]


def make_policy(name: str, *, load_factor: float = DEFAULT_LOAD_FACTOR) -> Policy:
    """The policy named ``name`` (one of :data:`POLICIES`)."""
    if name == "least-load":
        return LeastLoad()
    if name == "affinity":
        return Affinity(load_factor)
    raise ValueError(f"unknown routing policy {name!r}: expected one of {', '.join(POLICIES)}")
