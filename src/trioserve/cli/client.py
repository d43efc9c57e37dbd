"""``trioserve client``: its options, and running it (``terminal_client.py`` streams)."""

from __future__ import annotations

import argparse
import os
from functools import partial

import trio

from ..config import Settings
from ..errors import CommandError
from ..options import positive
from .argument_types import server_url
from .parsers import USAGE_ERROR, HelpFormatter, Parser, log_level_option


def add_parser(commands: argparse._SubParsersAction[Parser]) -> None:
    client = commands.add_parser(
        "client",
        help="send a prompt and print the answer as it streams",
        description="Send a prompt to a trioserve server and print tokens as they arrive, "
        "over WebSocket (default) or SSE. Ctrl-C cancels the request cleanly.",
        formatter_class=HelpFormatter,
    )
    log_level_option(client, argparse.SUPPRESS)
    client.add_argument("prompt", help="the prompt (a user message for chat)")
    client.add_argument(
        "--url",
        type=server_url,
        default=f"http://127.0.0.1:{Settings().port}",
        help="the server, http(s)://HOST:PORT (HOST:PORT alone means http://)",
    )
    client.add_argument("--sse", action="store_true", help="use SSE instead of WebSocket")
    client.add_argument(
        "--completion", action="store_true", help="use the completions endpoint, not chat"
    )
    client.add_argument(
        "--max-tokens",
        type=positive(int),
        default=None,
        help="the most tokens to generate (default: the engine's limit)",
    )
    client.add_argument("--model", default=None, help="model name (default: the server's first)")
    client.add_argument(
        "--api-key",
        metavar="KEY",
        help="send 'Authorization: Bearer KEY' (default: $TRIOSERVE_API_KEY)",
    )


def client(args: argparse.Namespace) -> int:
    from ..terminal_client import run_client

    if args.sse and not args.url.startswith("http://"):
        raise CommandError(
            "--sse speaks plain http:// only: use an http:// --url, or leave --sse out "
            "(the WebSocket speaks https:// too)",
            USAGE_ERROR,
        )
    return trio.run(
        partial(
            run_client,
            args.url,
            args.prompt,
            sse=args.sse,
            endpoint="completion" if args.completion else "chat",
            max_tokens=args.max_tokens,
            model=args.model,
            api_key=args.api_key or os.environ.get("TRIOSERVE_API_KEY") or None,
        )
    )
