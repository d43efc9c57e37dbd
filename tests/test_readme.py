"""The README's first screen stays true: its route list names every route the application
serves (method and path), so a new user reading it misses none."""

from __future__ import annotations

from pathlib import Path

from trioserve.http.app import ROUTES, TEMPLATED
from trioserve.http.observe import WEBSOCKET_ROUTE

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_lists_every_route():
    text = README.read_text()
    section = text[text.index("Routes (") : text.index("## Documentation")]
    routes = {f"{method} {path}" for method, path in (*ROUTES, *TEMPLATED)}
    routes.add(f"GET {WEBSOCKET_ROUTE}")
    missing = sorted(route for route in routes if f"`{route}`" not in section)
    assert not missing, f"README.md's route list lacks {missing}"
