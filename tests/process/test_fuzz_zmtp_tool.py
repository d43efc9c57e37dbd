"""``python -m tools.fuzz_zmtp`` runs (from the repository's root; a smoke run: the
properties themselves are tests/transport/test_zmtp_fuzz.py)."""

from __future__ import annotations

import subprocess

from tests.helpers.waiting import HANG_GUARD
from tools.toolkit.processes import ROOT, tool_command


def test_the_zmtp_fuzzer_runs_rounds_and_reports_no_failure():
    done = subprocess.run(
        [*tool_command("fuzz_zmtp"), "--seconds", "0.5", "--target", "curve"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD * 3,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no failure in 0.5 s (curve: 1 rounds of 300 examples)" in done.stdout
