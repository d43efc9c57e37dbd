"""What the fuzz tools share: run each target's hypothesis property again and again, for as
long as asked, and stop at the first failing example (``tools.fuzz_http``, ``tools.fuzz_zmtp``)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable


def main(
    tool: str,
    description: str,
    examples: dict[str, int],
    property_for: Callable[[str], Callable],
) -> int:
    """``tool``: the fuzz tool's module (``tools.fuzz_http``); ``examples``: each target's
    examples per round; ``property_for(target)`` its property, run once per round. The exit
    status: 0, or 1 at the first failure."""
    parser = argparse.ArgumentParser(prog=f"python -m {tool}", description=description)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to fuzz")
    parser.add_argument("--target", choices=[*examples, "all"], default="all")
    args = parser.parse_args()
    targets = list(examples) if args.target == "all" else [args.target]
    end = time.monotonic() + args.seconds
    rounds = dict.fromkeys(targets, 0)
    while time.monotonic() < end:
        for target in targets:
            try:
                property_for(target)()
            except Exception as exc:
                print(f"{target}: a failing example after {rounds[target]} rounds: {exc!r}")
                return 1
            rounds[target] += 1
    summary = ", ".join(f"{t}: {n} rounds of {examples[t]} examples" for t, n in rounds.items())
    print(f"no failure in {args.seconds:g} s ({summary})")
    return 0
