"""``trioserve engine mock`` and ``trioserve engine vllm``: the commands of the engine
programs (``engine_programs/``), which parse their options themselves."""

from __future__ import annotations

import argparse

from ..errors import CommandError
from .parsers import HelpFormatter, Parser, log_level_option
from .preflight import no_vllm


def add_parser(commands: argparse._SubParsersAction[Parser]) -> None:
    from ..engine_programs import mock_program

    engine = commands.add_parser(
        "engine", help="run an engine", description="Run an engine that frontends connect to."
    )
    log_level_option(engine, argparse.SUPPRESS)
    kinds = engine.add_subparsers(
        dest="engine_kind",
        required=True,
        metavar="KIND",
        help="which engine; `trioserve engine KIND --help` for its options",
    )
    mock_engine = kinds.add_parser(
        "mock",
        help="the deterministic mock engine",
        description="Run the mock engine: deterministic text at a fixed token rate, with "
        "faults on demand per request (see docs/protocol.md).",
        formatter_class=HelpFormatter,
    )
    log_level_option(mock_engine, argparse.SUPPRESS)
    mock_program.add_arguments(mock_engine)
    # Everything after `engine vllm` is the vLLM engine's: trioserve's own options and
    # vLLM's (see engine_programs/vllm.py, whose parser is vLLM's own).
    vllm_engine = kinds.add_parser(
        "vllm",
        help="a vLLM engine (needs vllm installed): trioserve engine vllm MODEL --bind "
        "ADDRESS [vLLM's options]; `trioserve engine vllm --help` lists them",
        add_help=False,
        allow_abbrev=False,  # vLLM's options pass through: none may be taken for ours
    )
    log_level_option(vllm_engine, argparse.SUPPRESS)


def engine_mock(args: argparse.Namespace) -> int:
    from ..engine_programs import mock_program

    return mock_program.main(args)


def engine_vllm(argv: list[str]) -> int:
    try:
        from ..engine_programs import vllm

        return vllm.main(argv)
    except ImportError as exc:
        if exc.name is None or not exc.name.startswith("vllm"):
            raise
        raise CommandError(no_vllm(str(exc))) from exc
