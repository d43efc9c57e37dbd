"""vLLM's server options that shape the text pipeline (``--max-logprobs``, the structured
outputs backend, ``--generation-config``, ``--override-generation-config``) read into the
:class:`~trioserve.text.sampling.EngineLimits` of a served model: one reading for both
clients of EngineCore, the direct path (``cli/direct_vllm.py``) and the shared engine
(``engine_programs/vllm_enginecore.py``). The options come parsed
(``enginecore.server_options.vllm_server_options``); the engine has accepted them by now.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import CommandError
from .assets import SamplingDefaults
from .sampling import EngineLimits


def generation_options(options: Any) -> dict[str, Any]:
    """``--generation-config DIR`` (its ``generation_config.json``: the defaults and EOS
    ids instead of the model's) and ``--override-generation-config JSON``, for
    :class:`EngineLimits`. Raises :class:`CommandError` (status 2) for one it cannot read."""
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


def engine_limits(options: Any, max_model_len: int) -> EngineLimits:
    """The limits of a model whose engine registered ``max_model_len``, under ``options``
    (vLLM's server options, parsed)."""
    return EngineLimits(
        max_model_len=max_model_len,
        max_logprobs=options.max_logprobs,
        structured_outputs_backend=options.so_backend,
        generation_config=options.generation_config,
        **generation_options(options),
    )


__all__ = ["engine_limits", "generation_options"]
