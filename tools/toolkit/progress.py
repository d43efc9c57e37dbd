"""One status line on stderr for a long run, rewritten in place."""

from __future__ import annotations

import sys
import time


class Progress:
    """One status line on stderr, rewritten in place (plain lines when not a terminal)."""

    def __init__(self, total_estimate: float) -> None:
        self.t0 = time.monotonic()
        self.total = total_estimate
        self.tty = sys.stderr.isatty()
        self.status = ""

    def elapsed(self) -> str:
        s = int(time.monotonic() - self.t0)
        return f"{s // 60}:{s % 60:02d}"

    def show(self, status: str) -> None:
        self.status = status
        if self.tty:
            line = (
                f"[{self.elapsed()} / ~{int(self.total) // 60}:{int(self.total) % 60:02d}] {status}"
            )
            print("\r\033[K" + line, end="", file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        prefix = "\r\033[K" if self.tty else ""
        print(f"{prefix}[{self.elapsed()}] {text}", file=sys.stderr, flush=True)
