"""A test skipped for a missing program says which program and how to get it: the reason
reaches pytest's summary (a skip raised inside a trio test loses it to pytest-trio)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_browser_test_without_chromium_says_how_to_install_it():
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PATH"] = str(Path(sys.executable).parent)  # python and pytest, no chromium
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         "tests/http/test_pages.py::test_the_docs_page_sends_query_parameters"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "chromium is not installed (apt-get install chromium)" in run.stdout
