"""What the engine programs (``trioserve engine mock``, ``trioserve engine vllm``) share: the
options of an engine process, parsed one way by both (:class:`ProcessOptions`), and the
plumbing around serving: signals, exiting with the parent, the one line a bind error is.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import signal
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..errors import CommandError
from ..options import BASIC_TYPES, SECONDS, add_options, from_args, option
from ..transport.keys import CurveServerKeys, server_keys

if TYPE_CHECKING:
    import zmq

log = logging.getLogger(__name__)

#: Seconds between two looks at the parent (polling is the portable way to learn of a
#: parent's death: no event exists for it).
PARENT_POLL = 0.5


@attrs.define
class ProcessOptions:
    """The options every engine program takes, as fields (``options.option``)."""

    bind: str = option(
        "tcp://127.0.0.1:5555",
        group="engine",
        metavar="ADDRESS",
        help="ZeroMQ address to bind (ROUTER): tcp://HOST:PORT or ipc://PATH",
    )
    frontend_timeout: float = option(
        5.0,
        group="engine",
        kind="positive",
        unit=SECONDS,
        help="seconds of frontend silence before its requests are aborted here",
    )
    grace_period: float = option(
        30.0,
        group="engine",
        kind="non_negative",
        unit=SECONDS,
        help="on SIGTERM or SIGINT the engine drains: it tells its frontends, refuses new "
        "requests (they go to another engine), lets those it has finish for up to this "
        "long, ends the rest, and exits 0; a second signal ends the grace period "
        "(docs/engines.md)",
    )
    log_aborts: bool = option(False, group="engine", help="log every abort received")
    exit_with_parent: int | None = option(
        None,
        group="engine",
        kind="pid",
        metavar="PID",
        const=0,
        help="exit when the parent process dies: PID, or the parent at start if none is "
        "given (`trioserve run` gives its own, so that an engine whose parent died while it "
        "was starting exits too)",
    )
    curve_secret_key: str = option(
        "",
        group="curve",
        metavar="FILE",
        help="speak CURVE only (encrypted, and only frontends whose keys are authorized get "
        "in) with this engine's secret key: PREFIX.key_secret from `trioserve keygen "
        "PREFIX`, a zmq.auth secret certificate or a bare Z85 key; needs "
        "--curve-authorized-keys (docs/security.md)",
    )
    curve_authorized_keys: str = option(
        "",
        group="curve",
        metavar="FILE|DIR",
        help="the frontends' public keys this engine accepts: a file of Z85 keys, one a line, "
        "or a directory whose *.key certificates each hold one",
    )

    @classmethod
    def add_to(cls, groups: Mapping[str, argparse._ActionsContainer]) -> None:
        """Add the options to the groups "engine" and "curve" of a program's parser."""
        add_options(groups, cls, types=TYPES)

    @classmethod
    def read(cls, args: argparse.Namespace) -> ProcessOptions:
        return from_args(cls, args)

    def curve(self) -> CurveServerKeys | None:
        """The keys the CURVE options name, or None (NULL: no security) when neither is
        given. Raises CommandError (a usage error) with what is wrong."""
        secret, authorized = self.curve_secret_key, self.curve_authorized_keys
        if not secret and not authorized:
            return None
        if not (secret and authorized):
            raise CommandError(
                "--curve-secret-key and --curve-authorized-keys go together: an engine that "
                "speaks CURVE says which frontends it accepts",
                2,
            )
        try:
            return server_keys(secret, authorized)
        except ValueError as exc:
            raise CommandError(str(exc), 2) from exc

    def parent(self) -> int | None:
        """The process whose death ends this one (None: no such process)."""
        if self.exit_with_parent is None:
            return None
        return self.exit_with_parent or os.getppid()


TYPES: dict[str, Callable[[type], Callable[[str], Any]]] = {
    **BASIC_TYPES,
    "pid": lambda _kind: BASIC_TYPES["non_negative"](int),
}


def security(curve: CurveServerKeys | None) -> str:
    """The engine link's security, for the line that says the engine serves."""
    return f"CURVE, {len(curve.authorized)} frontend key(s) authorized" if curve else "NULL"


def bind_error(address: str, exc: zmq.ZMQError) -> CommandError:
    """The one line a failed bind of ``address`` is: what happened, and what to do."""
    import zmq

    fix = {
        errno.EADDRINUSE: "another process is bound there: stop it, or choose another port",
        errno.EACCES: "permission denied: ports below 1024 need privileges, and an ipc:// "
        "path a directory this user may write to",
        errno.ENOENT: "the ipc:// path's directory does not exist: create it, or choose "
        "another path",
        errno.EADDRNOTAVAIL: "the host is not an address of this machine: bind one of its "
        "addresses, or tcp://0.0.0.0:PORT for every interface",
        errno.ENODEV: "the host is not an address or interface of this machine: bind one of "
        "its addresses, or tcp://0.0.0.0:PORT for every interface",
    }.get(exc.errno or 0, "choose another --bind address, tcp://HOST:PORT or ipc://PATH")
    reason = zmq.strerror(exc.errno) if exc.errno else str(exc)
    return CommandError(f"cannot bind the engine to {address}: {reason}; {fix}")


def cancel_on_signals(task: asyncio.Task[Any]) -> None:
    """SIGTERM and SIGINT cancel ``task`` (until the SDK's drain takes them over)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)


async def exit_with_parent_trio(parent: int, scope: trio.CancelScope) -> None:
    """Cancel ``scope`` once ``parent`` is no longer this process's parent."""
    while os.getppid() == parent:  # noqa: ASYNC110
        await trio.sleep(PARENT_POLL)
    log.warning("parent process %d is gone; stopping", parent)
    scope.cancel()


async def exit_with_parent_asyncio(parent: int, task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` once ``parent`` is no longer this process's parent."""
    while os.getppid() == parent:  # noqa: ASYNC110
        await asyncio.sleep(PARENT_POLL)
    log.warning("parent process %d is gone; stopping", parent)
    task.cancel()
