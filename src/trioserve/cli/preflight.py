"""What `trioserve run` checks before anything starts, so that a mistake is one line and
the right exit status rather than a traceback once the engine has loaded: the TLS files,
the upload directory, the port, the engine link's keys, vLLM's presence."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import shlex
import socket
import sys
from pathlib import Path
from typing import Any

from ..config import Settings
from ..errors import CommandError
from .parsers import USAGE_ERROR

log = logging.getLogger("trioserve")

#: Errors of binding the listening socket, answered with one line and exit status 2.
LISTEN_ERRORS = frozenset({errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL})


def tls_usage_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the TLS options together, if anything."""
    if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
        return "--ssl-certfile and --ssl-keyfile go together: give both, or neither"
    if args.ssl_ca_certs and not args.ssl_certfile:
        return "--ssl-ca-certs (mutual TLS) needs --ssl-certfile and --ssl-keyfile"
    if args.ssl_client_cert and not args.ssl_ca_certs:
        return "--ssl-client-cert needs --ssl-ca-certs (the CAs client certificates come from)"
    return None


def check_tls_files(settings: Settings) -> None:
    """Refuse TLS files that cannot be used: checked before serving (each server builds
    its own context from them)."""
    if not settings.ssl_certfile:
        return
    import ssl

    from ..server import tls

    for option in ("ssl_certfile", "ssl_keyfile", "ssl_ca_certs"):
        path = getattr(settings, option)
        try:
            if path:
                open(path, "rb").close()  # only: can it be read?
        except OSError as exc:
            raise CommandError(
                f"--{option.replace('_', '-')} {path}: {exc.strerror or exc}; give the path "
                "of a readable PEM file"
            ) from exc
    try:
        tls.server_context(settings)
    except (OSError, ssl.SSLError) as exc:
        raise CommandError(
            f"TLS: the certificate, key or CA file cannot be used: {exc}; give PEM files: "
            "a certificate (chain), its own private key, and CA certificates"
        ) from exc


def check_upload_dir(path: str) -> None:
    """An ``--upload-dir`` that cannot hold files fails now, not at the first upload (the
    server would make it then: it is made now instead)."""
    if not path:
        return
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as exc:
        raise CommandError(
            f"--upload-dir {path}: {exc.strerror or exc}; give a directory this user may "
            "write to, or leave the option out (a private directory is then made)"
        ) from exc


def check_tokenizer(path: str) -> None:
    """A ``--tokenizer`` directory whose text assets cannot be read fails now, in one
    line, not in each worker as it starts."""
    if not path:
        return
    from ..text.assets import ModelText, ModelTextError

    try:
        ModelText.load(path)
    except ModelTextError as exc:
        raise CommandError(f"--tokenizer {path}: {exc}") from None


def check_can_listen(host: str, port: int) -> None:
    """Bind what the server will bind, and let it go: a port in use or a host that is not
    this machine's is then one line before anything starts (the server binds for real once
    its engine is ready)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CommandError(
            f"cannot listen on {host}: {exc.strerror}; --host takes an address or name of "
            "this machine (127.0.0.1, or 0.0.0.0 for every interface)"
        ) from exc
    for family, kind, proto, _, address in infos:
        try:
            sock = socket.socket(family, kind, proto)
        except OSError as exc:
            if exc.errno == errno.EAFNOSUPPORT:  # no IPv6 here: the servers skip it too
                continue
            raise
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno not in LISTEN_ERRORS:
                    raise
                raise CommandError(listen_error(host, port, exc)) from exc


def listen_error(host: str, port: int, exc: OSError) -> str:
    fix = {
        errno.EADDRINUSE: "another process listens there: stop it, or choose another --port",
        errno.EACCES: "ports below 1024 need privileges: choose --port 1024 or above",
        errno.EADDRNOTAVAIL: f"{host} is not an address of this machine: give --host one "
        "of its addresses (127.0.0.1, or 0.0.0.0 for every interface)",
    }.get(exc.errno or 0, "check --host and --port")
    return f"cannot listen on {host} port {port}: {exc.strerror}; {fix}"


def check_engine_curve(settings: Settings) -> None:
    """The engine link's CURVE options, checked (the key files read) before serving."""
    if not (settings.engine_curve_secret_key or settings.engine_curve_server_key):
        return
    if not settings.engines:
        raise CommandError(
            "--engine-curve-* keys are for --engine addresses; the engine `trioserve run` "
            "starts itself is reached over a private socket",
            USAGE_ERROR,
        )
    from ..server.frontend import engine_curve_keys

    try:
        keys = engine_curve_keys(settings)
    except ValueError as exc:
        raise CommandError(f"--engine-curve-*: {exc}", USAGE_ERROR) from exc
    assert keys is not None
    log.info("engine link: CURVE to %d engine(s)", len(settings.engines))


def check_vllm_options(
    model: str, vllm_args: str, engines: list[str], *, attach: bool = False
) -> None:
    """``--vllm`` and ``--vllm-args`` together, and with ``--engine``: a mistake is one
    line and status 2 here, not a traceback of vLLM's once it has started. (``attach``:
    the engine runs elsewhere, vLLM need not be installed here.)"""
    if vllm_args and not model:
        raise CommandError(
            "--vllm-args are options for the engine --vllm starts: give --vllm MODEL too, "
            "or leave --vllm-args out",
            USAGE_ERROR,
        )
    if not model:
        return
    if engines:
        raise CommandError(
            "--vllm starts an engine of its own, --engine names engines running elsewhere: "
            "give one or the other",
            USAGE_ERROR,
        )
    try:
        shlex.split(vllm_args)
    except ValueError as exc:
        raise CommandError(
            f"--vllm-args {vllm_args!r}: {exc}; give vLLM's options in one string, e.g. "
            "'--max-model-len 2048 --dtype bfloat16'",
            USAGE_ERROR,
        ) from exc
    from ..engine_programs.vllm import model_error

    problem = model_error(model)
    if problem is not None:
        raise CommandError(f"--vllm {problem}", USAGE_ERROR)
    if not attach:
        check_vllm_installed()


def check_vllm_attach(attach: str, model: str, vllm_path: str, workers: int) -> None:
    """``--vllm-attach HOST:PORT``: with ``--vllm MODEL`` (its text is read here), on the
    direct path, one process. (vLLM need not be installed here: the engine runs
    elsewhere.)"""
    if not attach:
        return
    host, _, port = attach.rpartition(":")
    if not model:
        raise CommandError(
            "--vllm-attach serves an EngineCore started elsewhere for --vllm MODEL: give "
            "--vllm MODEL too (its tokenizer and chat template are read here)",
            USAGE_ERROR,
        )
    if vllm_path != "direct":
        raise CommandError(
            f"--vllm-attach is the direct path's; --vllm-path {vllm_path} starts its engine",
            USAGE_ERROR,
        )
    if workers > 1:
        raise CommandError(
            "--vllm-attach serves one process: an engine started elsewhere is told one "
            "client's addresses at its handshake (run one frontend per engine, or --workers "
            "with an engine trioserve starts)",
            USAGE_ERROR,
        )
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CommandError(
            f"--vllm-attach {attach!r}: give HOST:PORT, e.g. 127.0.0.1:29550", USAGE_ERROR
        )


def check_vllm_installed() -> None:
    """``run --vllm`` starts its engine with this interpreter: without vllm, say so before
    anything starts rather than after the child has failed."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise CommandError(no_vllm(f"{sys.executable} has no module named 'vllm'"))


def no_vllm(reason: str) -> str:
    return (
        f"the vLLM engine needs vllm installed beside trioserve ({reason}): install it "
        "(docs/engines.md), or run this trioserve from vLLM's environment"
    )


def leaves(group: BaseExceptionGroup) -> list[Any]:
    """The exceptions of ``group`` and of the groups nested in it."""
    found: list[Any] = []
    for exc in group.exceptions:
        found += leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return found
