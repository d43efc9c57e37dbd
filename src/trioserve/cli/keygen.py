"""``trioserve keygen PREFIX``: a CURVE key pair for the engine link."""

from __future__ import annotations

import argparse

from ..errors import CommandError
from .parsers import USAGE_ERROR, Parser, log_level_option


def add_parser(commands: argparse._SubParsersAction[Parser]) -> None:
    keygen = commands.add_parser(
        "keygen",
        help="write a CURVE key pair for the engine link: PREFIX.key and PREFIX.key_secret",
        description="Write a CURVE key pair: PREFIX.key (the public certificate, to give the "
        "other side) and PREFIX.key_secret (mode 0600, to keep), as zmq.auth writes them. "
        "Existing files are not overwritten. See docs/security.md.",
    )
    log_level_option(keygen, argparse.SUPPRESS)
    keygen.add_argument("prefix", metavar="PREFIX", help="path and name, e.g. keys/frontend")


def keygen(args: argparse.Namespace) -> int:
    from ..transport.keys import read_public_key, write_keypair, z85_encode

    try:
        public, secret = write_keypair(args.prefix)
    except OSError as exc:
        raise CommandError(
            f"trioserve keygen: {exc}; give a PREFIX in a writable directory whose files do "
            "not exist yet (keys are never overwritten)",
            USAGE_ERROR,
        ) from exc
    print(f"{public}: the public key {z85_encode(read_public_key(public))} (give it out)")
    print(f"{secret}: the secret key (mode 0600; keep it)")
    return 0
