"""trioserve's built-in HTTP/1.1 and WebSocket server (``--server builtin``)."""

from .serve import Http1Config, serve_http1

__all__ = ["Http1Config", "serve_http1"]
