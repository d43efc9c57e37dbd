"""`trioserve engine vllm` parses the options every engine takes as `trioserve engine mock`
does (one parsing: engine_programs/process.py)."""

from __future__ import annotations

import sys

import pytest

from tests.engine_programs.test_process_options import parsed
from tests.helpers.vllm_session import HOW_TO_RUN, vllm_python


def test_the_vllm_engine_parses_the_shared_options_as_the_mock_does():
    python = vllm_python()
    if python is None:
        pytest.skip(HOW_TO_RUN)
    assert parsed(python, "vllm") == parsed(sys.executable, "mock")
