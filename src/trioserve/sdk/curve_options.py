"""An engine's CURVE options, shared by ``trioserve engine mock`` and ``trioserve engine
vllm`` (whose parsers differ): how they are spelled, and the keys they name."""

from __future__ import annotations

import argparse

from ..transport.keys import CurveServerKeys, server_keys


def add_curve_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--curve-secret-key",
        metavar="FILE",
        help="speak CURVE only (encrypted, and only frontends whose keys are authorized get "
        "in) with this engine's secret key: PREFIX.key_secret from `trioserve keygen "
        "PREFIX`, a zmq.auth secret certificate or a bare Z85 key; needs "
        "--curve-authorized-keys (docs/security.md)",
    )
    parser.add_argument(
        "--curve-authorized-keys",
        metavar="FILE|DIR",
        help="the frontends' public keys this engine accepts: a file of Z85 keys, one a line, "
        "or a directory whose *.key certificates each hold one",
    )


def curve_keys(args: argparse.Namespace) -> CurveServerKeys | None:
    """The keys the options name, or None (NULL: no security) when neither is given.
    Raises ValueError with what is wrong."""
    secret, authorized = args.curve_secret_key, args.curve_authorized_keys
    if not secret and not authorized:
        return None
    if not (secret and authorized):
        raise ValueError(
            "--curve-secret-key and --curve-authorized-keys go together: an engine that "
            "speaks CURVE says which frontends it accepts"
        )
    return server_keys(secret, authorized)
