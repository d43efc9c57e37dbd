import pytest

from tests.helpers.chromium import chromium_path
from tests.helpers.frontends import SERVERS


@pytest.fixture(params=SERVERS, autouse=True)
def http_server(request: pytest.FixtureRequest) -> str:
    """Every HTTP test runs once per server: the frontends it starts use that server."""
    return request.param


@pytest.fixture
def chromium() -> str:
    """The headless browser of the page tests, or a skip that says how to install it."""
    return chromium_path()
