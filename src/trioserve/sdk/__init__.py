"""The engine SDK: serve a backend over the engine protocol, on trio or asyncio (the
engines trioserve ships are in ``engine_programs/``)."""

from .asyncio_shell import AsyncioEngine, serve_engine_asyncio
from .core import Backend, EngineCore, Output, RequestError, Stats
from .trio_shell import TrioEngine, serve_engine

__all__ = [
    "AsyncioEngine",
    "Backend",
    "EngineCore",
    "Output",
    "RequestError",
    "Stats",
    "TrioEngine",
    "serve_engine",
    "serve_engine_asyncio",
]
