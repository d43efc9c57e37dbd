"""trioserve's built-in HTTP/1.1 and WebSocket server (``--server builtin``).

``protocol.py`` (HTTP/1.1 without I/O), ``config.py`` (settings and limits),
``connection.py`` (one client's socket), ``exchange.py`` (one request and its response:
the application's response channel), ``websocket.py`` (an upgraded connection),
``hangups.py`` (one watcher for every client's hang-up), ``serve.py`` (listening,
accepting, and each connection's cycle of requests).
"""

from .config import Http1Config
from .serve import serve_http1

__all__ = ["Http1Config", "serve_http1"]
