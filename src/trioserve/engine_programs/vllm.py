"""``trioserve engine vllm MODEL --bind ADDRESS [vLLM's options]``: a vLLM model served to
trioserve frontends (several at once; a frontend rolls without reloading the model; a
frontend gone silent has its requests aborted here). It needs ``vllm`` installed beside
trioserve.

Two backends, ``--backend``:

- ``enginecore`` (the default, ``vllm_enginecore.py``): this process is the client of a
  vLLM EngineCore it starts headless, with trioserve's own text pipeline (the same as
  ``trioserve run --vllm``'s direct path): the one vLLM integration of the project.
- ``asyncllm`` (``vllm_asyncllm.py``): vLLM's ``AsyncLLM`` in this process, for what the
  EngineCore backend does not serve yet (multimodal inputs, LoRA adapters, non-HF
  tokenizers, a server-side chat template); it refuses those with a line naming this
  backend.

trioserve's own options are parsed here; every other option is vLLM's, as ``vllm serve``
spells them (passed to its launcher, or to ``AsyncLLM``'s parser), and MODEL comes first.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from ..enginecore.client import LOAD_TIMEOUT
from ..errors import CommandError
from .process import ProcessOptions, bind_error

log = logging.getLogger(__name__)

#: The backends, the default first.
BACKENDS = ("enginecore", "asyncllm")


class _Parser(argparse.ArgumentParser):
    """trioserve's options; the rest are vLLM's (collected in ``vllm_args``)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see: {self.prog} --help)\n")
        raise SystemExit(2)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, rest = self.parse_known_args(args, namespace)
        parsed.vllm_args = rest
        return parsed


def build_parser() -> argparse.ArgumentParser:
    """trioserve's options of ``trioserve engine vllm``; :meth:`parse_args` leaves the rest
    (vLLM's) in ``vllm_args``."""
    parser = _Parser(
        prog="trioserve engine vllm",
        description="Serve a model with vLLM to trioserve frontends over ZeroMQ. Every "
        "option not listed here is vLLM's, as `vllm serve` spells it (see `vllm serve "
        "--help`); MODEL comes first.",
        allow_abbrev=False,  # vLLM's options pass through: none may be taken for ours
    )
    parser.add_argument("model", metavar="MODEL", help="a model directory or a Hugging Face name")
    group = parser.add_argument_group("trioserve")
    ProcessOptions.add_to({"engine": group, "curve": group})
    group.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve vLLM's figures (its scheduler's running and waiting counts, KV-cache "
        "usage, requests by finish reason, tokens) and the engine's request counts as "
        "Prometheus metrics on 127.0.0.1:PORT (0: any free port, logged)",
    )
    group.add_argument(
        "--backend",
        choices=BACKENDS,
        default=BACKENDS[0],
        help="enginecore: this process is vLLM's EngineCore client, with trioserve's text "
        "pipeline; asyncllm: vLLM's AsyncLLM, for multimodal inputs, LoRA adapters and "
        "non-HF tokenizers (docs/engines.md)",
    )
    group.add_argument(
        "--load-timeout",
        type=float,
        default=LOAD_TIMEOUT,
        metavar="SECONDS",
        help="seconds EngineCore may take to load the model (enginecore backend)",
    )
    return parser


def main(argv: Sequence[str]) -> int:
    """Serve the model ``argv`` names until a signal has drained the engine or its parent
    is gone (0), or vLLM's EngineCore died (1). Raises CommandError for a key, an address
    or an option it cannot use."""
    args = build_parser().parse_args(list(argv))
    problem = model_error(args.model)
    if problem is not None:
        raise CommandError(problem, 2)
    if importlib.util.find_spec("vllm") is None:
        raise ModuleNotFoundError("No module named 'vllm'", name="vllm")
    process = ProcessOptions.read(args)
    curve = process.curve()  # before the model loads: a wrong key file fails at once
    if args.backend == "asyncllm":
        from .vllm_asyncllm import serve_asyncllm

        return serve_asyncllm(
            args.model, args.vllm_args, process, curve, metrics_port=args.metrics_port
        )
    import trio
    import zmq

    from . import vllm_enginecore

    agent_flags = {"--tool-call-parser", "--enable-auto-tool-choice", "--reasoning-parser"}
    if agent_flags & {arg.split("=", 1)[0] for arg in args.vllm_args}:
        # The frontend parses answers (text/agents); vLLM's engine has no use for these.
        log.warning(
            "--tool-call-parser, --enable-auto-tool-choice and --reasoning-parser are the "
            "frontend's: give them to `trioserve run` (this engine renders the tools and "
            "leaves the parsing to it)"
        )
    try:
        return trio.run(
            lambda: vllm_enginecore.serve(
                args.model,
                args.vllm_args,
                process,
                curve,
                metrics_port=args.metrics_port,
                load_timeout=args.load_timeout,
            )
        )
    except BaseExceptionGroup as group:
        # One error out of the nurseries is that error (a usage error's one line; a
        # failed bind of the --bind address, said as the mock says it).
        leaf = _only_leaf(group)
        if isinstance(leaf, zmq.ZMQError):
            raise bind_error(process.bind, leaf) from group
        if isinstance(leaf, (CommandError, KeyboardInterrupt)):
            raise leaf from None
        raise


def _only_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        exc = pending.pop()
        if isinstance(exc, BaseExceptionGroup):
            pending.extend(exc.exceptions)
        else:
            leaves.append(exc)
    return leaves[0] if len(leaves) == 1 else None


def model_error(model: str) -> str | None:
    """What is wrong with ``--vllm MODEL`` / ``trioserve engine vllm MODEL`` before vLLM
    is loaded, if anything: a model is a directory here or a Hugging Face name."""
    if os.path.exists(model):
        return None
    if _HF_NAME.fullmatch(model) and "--" not in model and ".." not in model:
        return None  # vLLM looks it up on the Hub (or in its cache)
    return (
        f"{model}: no such directory, and not a Hugging Face model name (NAME or ORG/NAME): "
        "give the directory of a model, or its name"
    )


#: A Hugging Face repository id, as huggingface_hub's validate_repo_id takes it.
_HF_NAME = re.compile(r"(?:[\w\-.]+/)?[\w\-.]{1,96}")
