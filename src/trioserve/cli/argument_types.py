"""The argument types of the command line beyond the numbers of ``options.py``: each turns
the text of an option into its value, or raises ``argparse.ArgumentTypeError`` with what
was expected (argparse then prints one line and exits 2)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from ..engine import discovery
from ..options import BASIC_TYPES, number
from ..transport.zmtp import parse_address


def port(text: str) -> int:
    value = number(int)(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port, 0-65535 (0: any free one), got {text}")
    return value


def load_factor(text: str) -> float:
    value = number(float)(text)
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {text}")
    return value


def server_name(value: str) -> str:
    """``--server``: ``h11`` is the built-in server's name before it left h11 for httptools."""
    return "builtin" if value == "h11" else value


def engine_address(text: str) -> str:
    """Refused here, not with a traceback when the frontend starts."""
    try:
        if discovery.parse_dns(text) is None:
            parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def dns_server(text: str) -> str:
    try:
        discovery.parse_server(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def api_key(text: str) -> str:
    from ..http.auth import check_key

    try:
        check_key(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def network(text: str) -> str:
    from ..http.bodies.media import parse_networks

    try:
        parse_networks([text])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def origin(text: str) -> str:
    """``--cors-origin``: what a browser sends in ``Origin`` (``SCHEME://HOST[:PORT]``), or
    ``*``; anything else would never match a request, silently."""
    if text == "*":
        return text
    parts = urlsplit(text)
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number 0-65535
        well_formed = bool(parts.scheme and parts.hostname)
    except ValueError:
        well_formed = False
    if not well_formed or parts.path or parts.query or parts.fragment or "@" in parts.netloc:
        raise argparse.ArgumentTypeError(
            f"expected an origin, SCHEME://HOST[:PORT] as a browser sends it (e.g. "
            f"https://app.example, no path), or '*'; got {text!r}"
        )
    return text


def cpu_set(text: str) -> str:
    """``--vllm-cpus``: checked here, resolved when the engine starts (:func:`vllm_cpus`)."""
    vllm_cpus(text)
    return text


def vllm_cpus(spec: str) -> set[int] | None:
    """The CPUs ``--vllm-cpus`` names; None: no restriction."""
    available = sorted(os.sched_getaffinity(0))
    if spec == "all":
        return None
    if spec == "auto":
        return set(available[:-1]) if len(available) > 1 else None
    cpus: set[int] = set()
    try:
        for part in spec.split(","):
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{spec!r} is not a CPU list: give auto, all, or numbers and ranges such as 0-2,4"
        ) from None
    if not cpus or not cpus <= set(available):
        raise argparse.ArgumentTypeError(
            f"{spec!r}: this process may use CPUs {','.join(map(str, available))} only"
        )
    return cpus


def server_url(text: str) -> str:
    """``client --url``: http(s)://HOST[:PORT]; ``HOST:PORT`` alone is taken as http://."""
    url = text if "://" in text else f"http://{text}"
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number 0-65535
    except ValueError:
        parts = parts._replace(netloc="")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"expected http://HOST:PORT or https://HOST:PORT (e.g. http://127.0.0.1:8000), "
            f"got {text!r}"
        )
    return url


def _fixed(parse: Callable[[str], Any]) -> Callable[[type], Callable[[str], Any]]:
    return lambda _kind: parse


#: The argument types of the CLI by the name a field's ``kind`` gives: options.py's, and
#: those that know trioserve's addresses and keys.
BY_KIND: dict[str, Callable[[type], Callable[[str], Any]]] = {
    **BASIC_TYPES,
    "port": _fixed(port),
    "load_factor": _fixed(load_factor),
    "server_name": _fixed(server_name),
    "engine_address": _fixed(engine_address),
    "dns_server": _fixed(dns_server),
    "api_key": _fixed(api_key),
    "network": _fixed(network),
    "cpu_set": _fixed(cpu_set),
    "origin": _fixed(origin),
}
