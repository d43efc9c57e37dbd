"""A ``--generation-config`` directory with sampling defaults and a second EOS id, on the
direct path (and its sampling defaults on the shared engine, ``trioserve engine vllm``): a
request that sets none of them gets the answer ``vllm serve`` gives the same
request with those values written out (the text layer's lowering is held to vLLM's own code
by ``test_text_parity.py``; here the engine's answer shows it end to end).

The extra EOS id is a token the seeded answer is known to generate, so the defaults' stop
really ends it early: ``finish_reason`` ``stop`` with that id as ``stop_reason``, as vLLM
adds a generation config's EOS ids to the request's stop tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.helpers.enginecore_session import HeadlessEngine, start_direct_frontend
from tests.helpers.processes import free_port
from tests.helpers.vllm import CHAT, COMPLETIONS, chat, completion, frontend_on, post_json
from tests.helpers.vllm_session import VLLM_OPTIONS, Vllm, start
from trioserve.enginecore.server_options import vllm_server_options
from trioserve.text.assets import ModelText
from trioserve.text.engine_options import engine_limits

#: Sampling defaults none of vLLM's own (its defaults: temperature 1, top_p 1, top_k 0,
#: min_p 0, penalties neutral): every field ``get_diff_sampling_param`` reads.
DEFAULTS = {
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 5,
    "min_p": 0.05,
    "repetition_penalty": 1.1,
    "presence_penalty": 0.3,
    "frequency_penalty": 0.2,
}
MAX_NEW_TOKENS = 12


def _answer(body: dict[str, Any]) -> dict[str, Any]:
    (choice,) = body["choices"]
    return {
        "text": choice["message"]["content"] if "message" in choice else choice["text"],
        "finish_reason": choice["finish_reason"],
        "stop_reason": choice.get("stop_reason"),
        "usage": [body["usage"][k] for k in ("prompt_tokens", "completion_tokens")],
    }


CASES = [(COMPLETIONS, completion("Once upon a", seed=5)), (CHAT, chat("Say something", seed=9))]


@pytest.mark.parametrize(("path", "request_body"), CASES)
async def test_generation_config_defaults_and_eos_ids_answer_as_vllm_serve(
    vllm: Vllm,
    enginecore: HeadlessEngine,
    text: ModelText,
    nursery,
    tmp_path: Path,
    path: str,
    request_body: dict[str, Any],
) -> None:
    explicit = {**request_body, **DEFAULTS, "max_tokens": MAX_NEW_TOKENS}
    probe = await post_json(vllm.reference_url, path, {**explicit, "return_token_ids": True})
    assert probe.status_code == 200, probe.text
    generated = probe.json()["choices"][0]["token_ids"]
    assert len(generated) == MAX_NEW_TOKENS, generated  # no EOS of its own in the probe
    eos = generated[MAX_NEW_TOKENS // 2]  # a token it generates: the second EOS id
    model_eos = json.loads((vllm.model_dir / "generation_config.json").read_text())["eos_token_id"]
    config = {**DEFAULTS, "max_new_tokens": MAX_NEW_TOKENS, "eos_token_id": [model_eos, eos]}
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    options = vllm_server_options(["--generation-config", str(tmp_path)])
    limits = engine_limits(options, enginecore.ready.max_model_len)
    direct = await start_direct_frontend(nursery, enginecore, text, limits=limits)

    ours = await post_json(direct.frontend.url, path, request_body)
    theirs = await post_json(vllm.reference_url, path, {**explicit, "stop_token_ids": [eos]})
    assert ours.status_code == theirs.status_code == 200, ours.text
    assert _answer(ours.json()) == _answer(theirs.json())
    assert _answer(ours.json())["finish_reason"] == "stop"
    assert _answer(ours.json())["stop_reason"] == eos
    assert _answer(ours.json())["usage"][1] <= MAX_NEW_TOKENS // 2 + 1


async def test_the_shared_engine_applies_the_generation_configs_defaults_as_vllm_serve(
    vllm: Vllm, nursery, tmp_path: Path
) -> None:
    """``trioserve engine vllm MODEL --generation-config DIR``: the shared engine's text
    layer reads the same defaults, and a request that sets none of them gets the answer
    ``vllm serve`` gives it with them written out."""
    config = {**DEFAULTS, "max_new_tokens": MAX_NEW_TOKENS}
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    address = f"tcp://127.0.0.1:{free_port()}"
    engine = start(
        vllm.python,
        ["-m", "trioserve", "engine", "vllm", str(vllm.model_dir), "--bind", address]
        + [*VLLM_OPTIONS, "--generation-config", str(tmp_path)],
        tmp_path / "engine.log",
    )
    try:
        await trio.to_thread.run_sync(
            engine.wait_for, lambda: "vLLM engine serving" in engine.output(), "the engine"
        )
        frontend = await frontend_on(nursery, vllm, engines=[address])
        for path, request_body in CASES:
            explicit = {**request_body, **DEFAULTS, "max_tokens": MAX_NEW_TOKENS}
            ours = await post_json(frontend.url, path, request_body)
            theirs = await post_json(vllm.reference_url, path, explicit)
            assert ours.status_code == theirs.status_code == 200, ours.text
            assert _answer(ours.json()) == _answer(theirs.json())
            assert _answer(ours.json())["usage"][1] <= MAX_NEW_TOKENS
    finally:
        engine.stop()
