"""``trioserve run --vllm MODEL`` on the direct path (the default, ``--vllm-path direct``):
this process is the client of vLLM's EngineCore, which it starts headless as a child (the
process tree: this frontend, vLLM's launcher, EngineCore, its worker), with the model's
text pipeline in this process (docs/engines.md).

When the EngineCore dies, every request in flight ends at once with one ``engine_lost``
error (its link fails them), ``/health`` answers 503, and once the errors are written
(at most :data:`LOST_GRACE` seconds) the server stops with status 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from ..errors import CommandError
from ..text.assets import ModelText, ModelTextError, SamplingDefaults
from ..text.sampling import EngineLimits

log = logging.getLogger("trioserve.cli")

#: Seconds the requests of a lost engine have to tell their clients why, before the server
#: stops.
LOST_GRACE = 5.0


def vllm_server_options(vllm_args: Sequence[str]) -> argparse.Namespace:
    """The few of vLLM's options the frontend must know (names, validation bounds); the
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


def generation_options(options: argparse.Namespace) -> dict[str, Any]:
    """``--generation-config DIR`` (its ``generation_config.json``: the defaults and EOS
    ids instead of the model's) and ``--override-generation-config JSON``, for
    :class:`EngineLimits`; the engine has accepted both by now."""
    out: dict[str, Any] = {}
    if options.generation_config not in ("auto", "vllm"):
        path = Path(options.generation_config) / "generation_config.json"
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise CommandError(f"--generation-config: cannot read {path} ({exc})", 2) from None
        out["generation"] = SamplingDefaults.from_config(config if isinstance(config, dict) else {})
    if options.override_generation_config:
        try:
            override = json.loads(options.override_generation_config)
        except ValueError as exc:
            raise CommandError(f"--override-generation-config is not JSON ({exc})", 2) from None
        if not isinstance(override, dict):
            raise CommandError("--override-generation-config must be a JSON object", 2)
        out["override_generation_config"] = override
    return out


def model_directory(model: str, tokenizer: str | None) -> Path:
    """Where the model's tokenizer and templates are: the directory given, or vLLM's
    download of a hub name (made by the engine, which has loaded it by now)."""
    name = tokenizer or model
    if os.path.isdir(name):
        return Path(name)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception as exc:
        raise CommandError(
            f"the direct vLLM path reads the tokenizer of {name!r} from a local directory or "
            f"the Hugging Face cache, and found neither ({exc}); use --vllm-path shared"
        ) from None


async def serve_direct(
    model: str,
    vllm_args: Sequence[str],
    *,
    cpus: set[int] | None,
    load_timeout: float,
    serve: Callable[..., Awaitable[None]],
) -> int:
    """Start the EngineCore, serve the frontend over it (``serve(links=...)``) until it
    drains or the engine dies; the exit status (1: the engine died)."""
    from ..enginecore.launcher import open_child_engine
    from ..errors import EngineLostError
    from ..links.vllm import VllmLinks, VllmText

    options = vllm_server_options(vllm_args)
    if options.tokenizer_mode not in ("auto", "hf"):
        raise CommandError(
            f"--tokenizer-mode {options.tokenizer_mode} is not served on the direct vLLM "
            "path (its tokenizer is HF's tokenizer.json); use --vllm-path shared",
            2,
        )
    status = 0
    try:
        async with open_child_engine(
            model, vllm_args, cpus=cpus, load_timeout=load_timeout
        ) as child:
            directory = model_directory(model, options.tokenizer)
            try:
                text = await trio.to_thread.run_sync(ModelText.load, directory)
            except ModelTextError as exc:
                raise CommandError(
                    f"the direct vLLM path cannot read {directory}'s tokenizer ({exc}); "
                    "use --vllm-path shared"
                ) from None
            limits = EngineLimits(
                max_model_len=child.ready.max_model_len,
                max_logprobs=options.max_logprobs,
                structured_outputs_backend=options.so_backend,
                generation_config=options.generation_config,
                **generation_options(options),
            )
            names = options.served_model_name or [model]
            links = VllmLinks(child.client, VllmText(text, limits), names)
            address = f"vllm://{names[0]}"
            # The frontend is shielded from the engine's loss (which cancels this body) so
            # that its requests can tell their clients why; it is stopped after LOST_GRACE.
            with trio.CancelScope(shield=True):
                async with trio.open_nursery() as nursery:

                    async def stop_when_lost() -> None:
                        await child.client.lost.wait()
                        nonlocal status
                        status = 1
                        await trio.sleep(LOST_GRACE)
                        nursery.cancel_scope.cancel()

                    async def frontend(task_status: trio.TaskStatus[Any]) -> None:
                        await serve(links=[(address, links)], task_status=task_status)
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(stop_when_lost)
                    app, _, _ = await nursery.start(frontend)
                    # /tokenize and the render routes read the model's text from here.
                    for name in names:
                        app.services.texts.register(name, text, limits)
    except EngineLostError as exc:
        log.error("%s; stopping", exc)
        return 1
    return status


__all__ = ["serve_direct"]
