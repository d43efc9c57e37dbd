"""How the tools report: figures as table cells (median and range), ratios per round,
and their tables printed, written as JSON and put in their section of the docs."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

DASH = "\u2013"


def fmt(value: float, digits: int) -> str:
    if value is None or math.isnan(value):
        return "—"
    return f"{value:,.{digits}f}"


def cell(values: list[float], digits: int) -> str:
    good = [v for v in values if not math.isnan(v)]
    if not good:
        return "\u2014"
    median = statistics.median(good)
    if len(good) == 1:
        return fmt(median, digits)
    return f"{fmt(median, digits)} ({fmt(min(good), digits)}{DASH}{fmt(max(good), digits)})"


def ratios(a: list[float], b: list[float]) -> str:
    out = []
    for x, y in zip(a, b, strict=True):
        out.append(f"{x / y:.2f}" if not (math.isnan(x) or math.isnan(y) or y == 0) else "—")
    return ", ".join(out)


def publish(
    text: str,
    command: str,
    results: object,
    json_path: str | None,
    docs_path: str | None,
    begin: str,
    end: str,
) -> None:
    """A measuring tool's output: print its table, and write its figures as JSON and its
    section of the docs (between ``begin`` and ``end``) where asked."""
    print(text)
    if json_path:
        Path(json_path).write_text(json.dumps({"command": command, "results": results}, indent=2))
    if docs_path:
        write_docs(Path(docs_path), f"{begin}\n{text}\n{end}", begin, end)


def write_docs(path: Path, text: str, begin: str, end: str) -> None:
    """Put ``text`` (which starts with ``begin`` and ends with ``end``) in place of the
    section between those markers, or at the end of the file if it has none."""
    doc = path.read_text()
    if begin in doc and end in doc:
        doc = doc[: doc.index(begin)] + text + doc[doc.index(end) + len(end) :]
    else:
        doc = doc.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(doc)
