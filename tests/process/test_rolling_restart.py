"""A rolling restart behind a real load balancer (nginx), under steady load: no client may
see a failure, and every stream that started must complete.

Two `trioserve run` instances share one mock engine process; nginx balances between them.
Each instance in turn gets SIGTERM; once its listener has closed (after --drain-delay) a
replacement starts on the same port, and the next instance is only restarted once the
replacement is healthy. nginx retries a refused connection, or a 503 sent before any
response byte (a replacement whose engine handshake is still under way), on the other
instance: see docs/deployment.md for the configuration this mirrors.
"""

from __future__ import annotations

import pytest

from tests.helpers.processes import free_port, start_engine_process
from tests.helpers.rolling import roll_under_load

pytestmark = pytest.mark.integration


async def test_rolling_restart_through_nginx_drops_nothing(nursery, tmp_path, nginx):
    engine_port = free_port()
    await start_engine_process(nursery, engine_port)
    outcome = await roll_under_load(
        nursery, tmp_path, f"tcp://127.0.0.1:{engine_port}", {"max_tokens": 20}
    )
    assert not outcome.failures, outcome.failures[:10]
    assert outcome.streams_started == outcome.streams_completed > 0
    assert outcome.ok > 50
