"""The vLLM engine drains through the SDK, as the mock does: SIGTERM while streams run
on it, every stream completes, vLLM finishes what it had and aborts nothing, and the
engine exits 0."""

from __future__ import annotations

import re
import signal

import pytest
import trio

from tests.helpers.frontends import start_frontend
from tests.helpers.processes import free_port
from tests.helpers.vllm_session import (
    FRONTEND_TIMEOUT,
    MODEL,
    START_GUARD,
    VLLM_OPTIONS,
    start,
)

pytestmark = pytest.mark.integration


async def test_sigterm_drains_the_vllm_engine_without_failing_its_streams(
    tiny_model, nursery, tmp_path
):
    python, model_dir = tiny_model
    address = f"tcp://127.0.0.1:{free_port()}"
    engine = start(
        python,
        ["-m", "trioserve", "engine", "vllm", str(model_dir), "--bind", address]
        + ["--grace-period", "300", *VLLM_OPTIONS],
        tmp_path / "engine.log",
    )
    try:
        await trio.to_thread.run_sync(
            engine.wait_for, lambda: "vLLM engine serving" in engine.output(), "the vLLM engine"
        )
        frontend = await start_frontend(
            nursery, None, server="builtin", engines=[address], heartbeat_timeout=FRONTEND_TIMEOUT
        )
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 64}
        body |= {"temperature": 0, "ignore_eos": True, "stream": True}
        body |= {"stream_options": {"include_usage": True}}
        texts: dict[int, str] = {}
        async with frontend.client() as client:

            async def stream(i: int, task_status: trio.TaskStatus) -> None:
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    assert response.status_code == 200
                    chunks = response.aiter_text()
                    texts[i] = await anext(chunks)
                    task_status.started()  # running in vLLM: its first token came
                    texts[i] += "".join([chunk async for chunk in chunks])

            async with trio.open_nursery() as streams:
                for i in range(3):
                    await streams.start(stream, i)
                # The engine's process alone, as Kubernetes signals a container's first
                # process: vLLM's engine-core process is its child.
                engine.process.send_signal(signal.SIGTERM)
        with trio.fail_after(START_GUARD):
            code = await trio.to_thread.run_sync(engine.process.wait)
        assert code == 0, engine.output()[-3000:]
    finally:
        engine.stop()
    for text in texts.values():
        assert text.endswith("data: [DONE]\n\n"), text[-500:]
        assert '"completion_tokens":64,' in text  # the whole answer, as vLLM counted it
    [stats] = re.findall(r"drained: Stats\((.*?)\)", engine.output())
    assert "submitted=3, finished=3, aborted=0, orphaned=0" in stats
