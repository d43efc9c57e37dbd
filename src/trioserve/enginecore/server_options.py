"""The few of vLLM's server options a client of EngineCore must know itself (served names,
validation bounds, where the tokenizer is), read from the options it passes on to the
engine, and where the model's tokenizer and templates are on disk. Shared by both clients
of EngineCore: the direct path (``cli/direct_vllm.py``) and the shared engine
(``engine_programs/vllm_enginecore.py``)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import CommandError

#: vLLM server options that change answers and that trioserve's text pipeline does not
#: implement: refused at start rather than ignored (the answers would differ from vllm
#: serve's).
UNSERVED_OPTIONS = {
    "--chat-template": "a server-side chat template",
    "--chat-template-content-format": "a chat template content format",
    "--default-chat-template-kwargs": "default chat template arguments",
    "--trust-request-chat-template": "requests' own chat templates",
    "--enable-lora": "LoRA adapters",
    "--lora-modules": "LoRA adapters",
}


def refuse_unserved_options(vllm_args: Sequence[str], where: str, otherwise: str) -> None:
    """:class:`CommandError` (status 2) for an option of :data:`UNSERVED_OPTIONS`: it is
    not served ``where`` (``"on the direct vLLM path"``); ``otherwise``: what serves it."""
    for arg in vllm_args:
        name = arg.split("=", 1)[0]
        if name in UNSERVED_OPTIONS:
            raise CommandError(
                f"{name} ({UNSERVED_OPTIONS[name]}) is not served {where}; {otherwise}", 2
            )


def vllm_server_options(vllm_args: Sequence[str]) -> argparse.Namespace:
    """The few of vLLM's options the client must know (names, validation bounds); the
    rest are the engine's."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--served-model-name", nargs="+", default=None)
    parser.add_argument("--max-logprobs", type=int, default=20)
    parser.add_argument("--generation-config", default="auto")
    parser.add_argument("--override-generation-config", default=None)
    parser.add_argument("--structured-outputs-config.backend", dest="so_backend", default="auto")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--tokenizer-mode", default="auto")
    known, _ = parser.parse_known_args(list(vllm_args))
    return known


def model_directory(model: str, tokenizer: str | None, *, otherwise: str) -> Path:
    """Where the model's tokenizer and templates are: the directory given, or vLLM's
    download of a hub name (made by the engine, which has loaded it by now). Raises
    :class:`CommandError` ending with ``otherwise`` (what the user can do instead)."""
    name = tokenizer or model
    if os.path.isdir(name):
        return Path(name)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception as exc:
        raise CommandError(
            f"trioserve reads the tokenizer of {name!r} from a local directory or the "
            f"Hugging Face cache, and found neither ({exc}); {otherwise}"
        ) from None


__all__ = [
    "UNSERVED_OPTIONS",
    "model_directory",
    "refuse_unserved_options",
    "vllm_server_options",
]
