"""The command line: one parser for every command, and the dispatch to each."""

from __future__ import annotations

import argparse
import logging

from .. import __version__, logs
from ..errors import CommandError
from . import client, engine_commands, keygen, run
from .parsers import INTERRUPTED, HelpFormatter, Parser, log_format_option, log_level_option

log = logging.getLogger("trioserve")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="trioserve",
        description=(
            "An HTTP frontend for model-inference engines, on Trio: OpenAI-compatible routes "
            "to clients, ZeroMQ to engines, and exactly one abort for every request that "
            "ends early."
        ),
        epilog="Exit status: 0 when done; 1 when something the command names cannot be used "
        "(a port, a host, a file, a server, an engine address); 2 when the command line is "
        "wrong. Either is one line on stderr, with the traceback under --log-level debug.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"trioserve {__version__}")
    log_level_option(parser, "info")
    log_format_option(parser, "text")
    commands = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        help="what to do; `trioserve COMMAND --help` for its options",
    )
    run.add_parser(commands)
    client.add_parser(commands)
    keygen.add_parser(commands)
    engine_commands.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` names; returns the exit status. A usage error (the command
    line is wrong) is one line and status 2; an environment error (something the command
    line names cannot be used) one line and status 1; a traceback only for a bug, or
    under ``--log-level debug``."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    command = _command_parser(parser, args)
    if extra and not (args.command == "engine" and args.engine_kind == "vllm"):
        command.error(f"unrecognized arguments: {' '.join(extra)}")
    logs.configure(args.log_level, args.log_format)
    try:
        if args.command == "run":
            return run.run(args)
        if args.command == "keygen":
            return keygen.keygen(args)
        if args.command == "client":
            return client.client(args)
        if args.engine_kind == "vllm":
            return engine_commands.engine_vllm(extra)
        return engine_commands.engine_mock(args)
    except CommandError as exc:
        if args.log_level == "debug":
            log.debug("the error below, with its traceback", exc_info=exc)
        log.error("%s", exc)
        return exc.exit_status
    except KeyboardInterrupt:
        # Ctrl-C before the command took signals over (the server then drains instead).
        return INTERRUPTED


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Parser:
    """The parser of the (sub)command ``args`` holds, for its usage errors."""
    names = [args.command, getattr(args, "engine_kind", None)]
    for name in names:
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subparsers or name is None:
            break
        parser = subparsers[0].choices[name]
    assert isinstance(parser, Parser)
    return parser
