"""The frontend side of the engine protocol, on Trio and ZeroMQ."""

from .client import EngineClient, open_engine_client
from .connection import EngineConnection, HeartbeatConfig
from .subscription import Subscription

__all__ = [
    "EngineClient",
    "EngineConnection",
    "HeartbeatConfig",
    "Subscription",
    "open_engine_client",
]
