"""nginx in front of trioserve, for the tests that need a real proxy (CI installs it)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from tests.helpers.waiting import HANG_GUARD

CONF = """
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
{user}
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream trioserve {{
{servers}
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://trioserve;
            proxy_http_version 1.1;
{location}
        }}
    }}
}}
"""


def nginx_binary() -> str:
    path = shutil.which("nginx") or (
        "/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None
    )
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("nginx is not installed: .ci/run must install it")
        pytest.skip("nginx is not installed here (CI installs it)")
    return path


@contextlib.asynccontextmanager
async def open_nginx(
    tmp: Path, port: int, upstreams: list[int], location: str = ""
) -> AsyncIterator[None]:
    """nginx on 127.0.0.1:``port`` balancing over ``upstreams`` (127.0.0.1 ports), with
    ``location`` added to the proxied location block; stopped when the block exits."""
    binary = nginx_binary()
    servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=0;" for p in upstreams)
    conf = tmp / "nginx.conf"
    conf.write_text(
        CONF.format(
            tmp=tmp,
            port=port,
            servers=servers,
            location=location,
            user="user root;" if os.geteuid() == 0 else "",
        )
    )
    process = await trio.lowlevel.open_process(
        [binary, "-c", str(conf), "-p", str(tmp)], stderr=subprocess.DEVNULL
    )
    try:
        with trio.fail_after(HANG_GUARD):
            while True:
                try:
                    await (await trio.open_tcp_stream("127.0.0.1", port)).aclose()
                    break
                except OSError:
                    await trio.sleep(0.02)
        yield
    finally:
        process.terminate()
        with trio.move_on_after(5):
            await process.wait()
