"""The frontend side of the engine protocol, on Trio and ZeroMQ."""

from .client import EngineClient, open_engine_client
from .connection import EngineConnection, HeartbeatConfig
from .discovery import NameserverResolver, SystemResolver, make_resolver
from .routing import Affinity, LeastLoad, make_policy
from .subscription import Subscription

__all__ = [
    "Affinity",
    "EngineClient",
    "EngineConnection",
    "HeartbeatConfig",
    "LeastLoad",
    "NameserverResolver",
    "Subscription",
    "SystemResolver",
    "make_policy",
    "make_resolver",
    "open_engine_client",
]
