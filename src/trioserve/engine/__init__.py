"""The frontend's engine client: routing and failover over an engine-link interface.

Which protocol an engine speaks is its link's (``trioserve.links``); nothing here imports
one."""

from .client import EngineClient, new_frontend_id, open_engine_client
from .discovery import NameserverResolver, SystemResolver, make_resolver
from .link import EngineLink, LinkFactory, Prepared, Preparer
from .routing import Affinity, LeastLoad, make_policy
from .subscription import Subscription

__all__ = [
    "Affinity",
    "EngineClient",
    "EngineLink",
    "LeastLoad",
    "LinkFactory",
    "NameserverResolver",
    "Prepared",
    "Preparer",
    "Subscription",
    "SystemResolver",
    "make_policy",
    "make_resolver",
    "new_frontend_id",
    "open_engine_client",
]
