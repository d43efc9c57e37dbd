"""A headless Chromium (Debian's package) driven over the DevTools protocol, for the
browser tests: trio-websocket speaks the protocol, so no WebDriver is needed.

Everything stays on 127.0.0.1: the browser's DevTools port and the pages it opens. The
browser is killed when the test's nursery ends; every wait is bounded.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from trio_websocket import open_websocket_url

from tests.helpers.waiting import HANG_GUARD

#: Where the tests leave their screenshots (ignored by git).
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


def chromium_path() -> str:
    """The browser, or a skip when it is not installed here (CI installs it: .ci/run).

    Call it from a synchronous fixture (tests/http/conftest.py's ``chromium``): a skip raised
    inside a trio test reaches pytest through pytest-trio, which drops its reason."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed, and CI must run the browser tests")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return found


class Page:
    """One browser tab, over its DevTools WebSocket."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send a command and return its result (events that arrive meanwhile are
        dropped: these tests poll the page instead)."""
        number = next(self._ids)
        await self.ws.send_message(json.dumps({"id": number, "method": method, "params": params}))
        with trio.fail_after(HANG_GUARD):
            while True:
                message = json.loads(await self.ws.get_message())
                if message.get("id") == number:
                    if "error" in message:
                        raise AssertionError(f"{method}: {message['error']}")
                    return message["result"]

    async def evaluate(self, expression: str) -> Any:
        result = await self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, what: str) -> Any:
        """Poll ``expression`` until it is truthy (bounded by the hang guard)."""
        with trio.move_on_after(HANG_GUARD):
            while not (value := await self.evaluate(expression)):
                await trio.sleep(0.02)
            return value
        raise AssertionError(f"gave up waiting for {what}")

    async def open(self, url: str) -> None:
        await self.call("Page.navigate", url=url)
        await self.wait_for("document.readyState === 'complete'", f"{url} to load")

    async def type_text(self, selector: str, text: str) -> None:
        """Focus an input and type into it as a keyboard would."""
        await self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        await self.call("Input.insertText", text=text)

    async def click(self, selector: str) -> None:
        await self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    async def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / name
        shot = await self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))
        print(f"screenshot: {path}")
        return path


@contextlib.asynccontextmanager
async def open_chromium(chromium: str, profile: Path) -> AsyncIterator[Page]:
    """A headless Chromium (the binary ``chromium``) with an empty profile under
    ``profile``, and its first tab."""
    process = await trio.lowlevel.open_process(
        [
            chromium,
            "--headless=new",
            "--no-sandbox",  # root in CI's container: the sandbox needs user namespaces
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "--window-size=1100,800",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        active = profile / "DevToolsActivePort"
        with trio.fail_after(HANG_GUARD):
            while not active.exists() or len(active.read_text().splitlines()) < 2:
                if process.returncode is not None:
                    raise AssertionError(f"chromium exited with {process.returncode}")
                await trio.sleep(0.05)
        port = int(active.read_text().splitlines()[0])
        async with httpx.AsyncClient(timeout=HANG_GUARD) as client:
            targets = (await client.get(f"http://127.0.0.1:{port}/json/list")).json()
        url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        async with open_websocket_url(url, max_message_size=64 * 2**20) as ws:
            yield Page(ws)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with trio.move_on_after(5), trio.CancelScope(shield=True):
            await process.wait()
