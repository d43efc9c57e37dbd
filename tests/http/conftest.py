import pytest


@pytest.fixture(autouse=True)
def _every_http_test_runs_on_both_servers(http_server: str) -> str:
    return http_server
