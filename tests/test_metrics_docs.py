"""docs/metrics.md is the authority on trioserve's metrics: it names every family of the
registry, and the other pages (api.md, the README) name none that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

from trioserve import metrics

ROOT = Path(__file__).resolve().parents[1]


def test_every_metric_family_is_documented_and_every_documented_one_exists():
    # docs/metrics.md is the authority on the metrics; api.md and the README only point
    # there, and may name a metric only if it exists.
    def family(name: str) -> str:
        return re.sub(r"_(bucket|count|sum|total|created)$", "", name)

    docs = ROOT / "docs"
    live = {family(f.name) for f in metrics.REGISTRY.collect()}
    documented = {
        family(n) for n in re.findall(r"trioserve_\w+", (docs / "metrics.md").read_text())
    }
    assert live <= documented, f"missing from docs/metrics.md: {sorted(live - documented)}"
    for page in (docs / "api.md", ROOT / "README.md"):
        named = {family(n) for n in re.findall(r"trioserve_\w+", page.read_text())}
        assert named <= live | documented, f"{page.name} names {sorted(named - live - documented)}"
