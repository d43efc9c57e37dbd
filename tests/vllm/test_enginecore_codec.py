"""The EngineCore codec (``trioserve.enginecore.codec``) against the installed vLLM's own
structs: every mirrored struct has vLLM's fields in vLLM's order with vLLM's defaults, and
messages encoded by vLLM's ``MsgpackEncoder`` decode with ours, and ours with vLLM's
decoder, for requests with every field set, outputs with logprobs (inline and in extra
frames), utility answers, scheduler figures and the handshake. A vLLM upgrade that moves a
field fails here.

The cases run in the vLLM interpreter, in one process (tests/helpers/enginecore_wire.py);
each is asserted here by name, with the case's traceback on failure.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.helpers.enginecore_wire import CASES
from tests.helpers.vllm_session import HOW_TO_RUN, ROOT, START_GUARD, vllm_env, vllm_python


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    python = vllm_python()
    if python is None:
        pytest.skip(HOW_TO_RUN)
    env = vllm_env()
    # This checkout's trioserve, whichever one the vLLM environment has installed.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [python, "-m", "tests.helpers.enginecore_wire"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=START_GUARD,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("name", sorted(CASES))
def test_codec_matches_vllms_own_structs(results: dict[str, str], name: str) -> None:
    assert name in results, f"case {name} did not run"
    if results[name] != "ok":
        pytest.fail(results[name], pytrace=False)
