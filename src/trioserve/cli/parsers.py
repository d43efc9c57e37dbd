"""What every command's parser shares: one-line usage errors, help that says each default
once, the log options, and the exit statuses."""

from __future__ import annotations

import argparse
from typing import NoReturn

#: Exit statuses: the command line is wrong (fix what was typed), or something it names
#: cannot be used (a port, a host, a file, a server, an engine address).
USAGE_ERROR = 2
ENVIRONMENT_ERROR = 1
#: After Ctrl-C before the server could take it over, as shells report a SIGINT.
INTERRUPTED = 130


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line that says where the help is (argparse
    prints the whole usage first: for ``run``, thirty lines above the one that matters)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


class HelpFormatter(argparse.HelpFormatter):
    """Each default said once: not appended where the help already tells it, nor when
    there is none to tell (None, empty, a switch's absence); a float as it would be typed
    (600, not 600.0)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        nothing = default is None or default is argparse.SUPPRESS or default in ([], "")
        takes_value = action.option_strings and action.nargs != 0
        if "default" in text or nothing or not takes_value:
            return text
        shown = format(default, "g") if isinstance(default, float) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


def log_level_option(parser: argparse.ArgumentParser, default: str) -> None:
    """``--log-level``, before the command or after it: the top level sets the default,
    the commands' copies leave the value alone unless given."""
    parser.add_argument(
        "--log-level",
        default=default,
        choices=["debug", "info", "warning", "error"],
        help="how much to log (debug: also the traceback of an error reported in one line)"
        + (" (default: info)" if default is argparse.SUPPRESS else ""),
    )


def log_format_option(parser: argparse.ArgumentParser, default: str) -> None:
    """``--log-format``, before the command or after ``run`` (as ``--log-level``)."""
    parser.add_argument(
        "--log-format",
        default=default,
        choices=["text", "json"],
        help="how every log line is written: text, or one JSON object a line (the access "
        "log's fields as keys; docs/metrics.md)"
        + (" (default: text)" if default is argparse.SUPPRESS else ""),
    )
