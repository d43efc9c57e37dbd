"""``trioserve``: the command line.

- ``trioserve run``: the frontend (starts the mock engine as a child when no --engine);
  its options are derived from ``config.Settings``, ``cli.run.RunOptions`` and the mock
  engine's ``MockOptions`` (``options.py``): to add one, add a field;
- ``trioserve client``: stream one answer to the terminal;
- ``trioserve engine mock``, ``trioserve engine vllm MODEL``: the engine programs
  (``engine_programs/``; vLLM needs vllm installed);
- ``trioserve keygen PREFIX``: a CURVE key pair for the engine link.

Modules: ``command_line`` (the parser, the dispatch), ``parsers`` (what every parser
shares), ``argument_types``, ``run`` and ``preflight`` (its checks), ``child_engine`` (the
engine `run` starts), ``engine_commands``, ``keygen``, ``client``.
"""

from ..config import GRACE_RULE
from .argument_types import vllm_cpus
from .command_line import build_parser, main
from .parsers import ENVIRONMENT_ERROR, INTERRUPTED, USAGE_ERROR
from .run import worker_main

__all__ = [
    "ENVIRONMENT_ERROR",
    "GRACE_RULE",
    "INTERRUPTED",
    "USAGE_ERROR",
    "build_parser",
    "main",
    "vllm_cpus",
    "worker_main",
]
