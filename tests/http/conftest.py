import pytest

from tests.helpers.frontends import SERVERS


@pytest.fixture(params=SERVERS, autouse=True)
def http_server(request: pytest.FixtureRequest) -> str:
    """Every HTTP test runs once per server: the frontends it starts use that server."""
    return request.param
