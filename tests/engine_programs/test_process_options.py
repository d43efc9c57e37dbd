"""The options every engine program takes (engine_programs/process.py) parse one way in
`trioserve engine mock` and in `trioserve engine vllm`: the same defaults, the same values
refused, `--exit-with-parent` with or without a PID (vLLM's half is
tests/vllm/test_engine_options.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers.vllm_session import ROOT, vllm_env

#: Parses each command line of argv[2] with the parser of program argv[1] and prints, for
#: each, the three shared options' values or the exit status of the refusal.
PARSE = """
import json, sys
def parser(program):
    if program == "vllm":
        from trioserve.engine_programs.vllm import build_parser
        return build_parser(), ["tiny"]
    from trioserve.cli import build_parser
    return build_parser(), ["engine", "mock"]
results = []
for argv in json.loads(sys.argv[2]):
    parse, head = parser(sys.argv[1])
    try:
        args = parse.parse_args([*head, *argv])
    except SystemExit as exit_:
        results.append(exit_.code)
        continue
    results.append([args.frontend_timeout, args.grace_period, args.exit_with_parent])
print(json.dumps(results))
"""

CASES = [
    ([], [5.0, 30.0, None]),
    (["--exit-with-parent"], [5.0, 30.0, 0]),  # the parent at start
    (["--exit-with-parent", "123"], [5.0, 30.0, 123]),
    (["--frontend-timeout", "2.5", "--grace-period", "0"], [2.5, 0.0, None]),
    (["--frontend-timeout", "0"], 2),
    (["--frontend-timeout", "-1"], 2),
    (["--grace-period", "-1"], 2),
    (["--grace-period", "soon"], 2),
    (["--exit-with-parent", "-5"], 2),
]


def parsed(python: str, program: str) -> list[object]:
    result = subprocess.run(
        [python, "-c", PARSE, program, json.dumps([argv for argv, _ in CASES])],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**vllm_env(), "PYTHONPATH": str(ROOT / "src")},
        timeout=300,
    )
    return json.loads(result.stdout.splitlines()[-1])


def test_the_mock_engine_parses_the_shared_options():
    assert parsed(sys.executable, "mock") == [expected for _, expected in CASES]
