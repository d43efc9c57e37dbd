"""Engines found by DNS: ``--engine dns://NAME:PORT``.

A name with one address per engine (a Kubernetes headless Service) is resolved every
``--engine-refresh`` seconds; every address it has (A and AAAA records) is an engine at
``tcp://ADDRESS:PORT``. The engine client connects to addresses that appear and lets go of
those that vanish once their requests have ended (:meth:`EngineClient.set_addresses
<trioserve.engine.client.EngineClient.set_addresses>`).

Two resolvers, one interface (:class:`Resolver`):

- :class:`SystemResolver` (the default): the system's resolver, through
  ``trio.socket.getaddrinfo``: ``/etc/hosts``, ``/etc/resolv.conf`` with its search
  domains (so a Service's short name works inside its namespace), nsswitch.
- :class:`NameserverResolver` (``--engine-dns-server HOST:PORT``): asks that DNS server
  directly, with dnspython's asynchronous resolver (which runs on trio); no search
  domains, so give the full name. ``getaddrinfo`` cannot be pointed at a server; this
  can, which is how the tests run a DNS server of their own and change its answers.

A name that does not exist, or has no address, means no engines (a headless Service with
no ready pod answers so); a resolution that fails (a timeout, a server failure) changes
nothing: the engines found before are kept, with one warning until it works again.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs
import trio

log = logging.getLogger(__name__)

SCHEME = "dns://"
#: Seconds between two resolutions of every ``dns://`` name (``--engine-refresh``).
DEFAULT_REFRESH = 5.0
#: Seconds one resolution (A and AAAA) may take before it counts as failed.
RESOLVE_TIMEOUT = 5.0
#: Addresses taken from one name, at most (the rest are ignored, with a warning).
MAX_ADDRESSES = 256


@attrs.frozen
class DnsName:
    """One ``dns://NAME:PORT``."""

    name: str
    port: int

    @property
    def spec(self) -> str:
        return f"{SCHEME}{self.name}:{self.port}"


def parse_dns(address: str) -> DnsName | None:
    """``address`` as a :class:`DnsName`, None if it is not a ``dns://`` address;
    ValueError if it is one, badly written."""
    if not address.startswith(SCHEME):
        return None
    name, _, port = address[len(SCHEME) :].rpartition(":")
    if not name or not port.isdigit() or not 0 < int(port) < 65536 or "/" in name:
        raise ValueError(
            f"engine address {address!r}: expected dns://NAME:PORT, e.g. "
            "dns://engines.default.svc.cluster.local:5555"
        )
    return DnsName(name, int(port))


def parse_server(text: str) -> tuple[str, int]:
    """``--engine-dns-server``: ``HOST:PORT`` or ``HOST`` (port 53), HOST an IP address
    (``[v6]:PORT`` for IPv6 with a port)."""
    host, port = text, "53"
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"DNS server {text!r}: expected HOST:PORT")
            port = rest[1:]
    elif text.count(":") == 1:
        host, port = text.split(":")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"DNS server {text!r}: HOST must be an IP address") from None
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"DNS server {text!r}: bad port {port!r}")
    return host, int(port)


def engine_address(ip: str, port: int) -> str:
    """The ZeroMQ address of the engine at ``ip``, ``port``."""
    return f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"


class Resolver(Protocol):
    async def resolve(self, name: str) -> list[str] | None:
        """Every address of ``name``; ``[]`` if it has none or does not exist; None if
        the resolution failed (keep what was known). Bounded in time by the caller."""
        ...


class SystemResolver:
    """The system's resolver (``getaddrinfo`` in a thread, as trio runs it)."""

    async def resolve(self, name: str) -> list[str] | None:
        try:
            infos = await trio.socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
                return []
            log.debug("resolving %s: %s", name, exc)
            return None
        return _unique(str(info[4][0]) for info in infos)


class NameserverResolver:
    """Asks one DNS server (``host``, ``port``) for A and AAAA records (dnspython)."""

    def __init__(self, host: str, port: int = 53) -> None:
        import dns.asyncresolver

        self.host, self.port = host, port
        self._resolver = dns.asyncresolver.Resolver(configure=False)
        self._resolver.nameservers = [host]
        self._resolver.port = port
        self._resolver.lifetime = RESOLVE_TIMEOUT

    async def resolve(self, name: str) -> list[str] | None:
        import dns.exception
        import dns.resolver

        addresses: list[str] = []
        for rdtype in ("A", "AAAA"):
            try:
                answer = await self._resolver.resolve(name, rdtype, search=False)
            except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
                continue
            except dns.exception.DNSException as exc:
                log.debug("resolving %s %s at %s:%d: %r", name, rdtype, self.host, self.port, exc)
                return None
            addresses += [rdata.address for rdata in answer]
        return _unique(addresses)


def _unique(addresses: object) -> list[str]:
    seen: dict[str, None] = {}
    for address in addresses:  # type: ignore[attr-defined]
        seen.setdefault(str(address), None)
    return list(seen)


def make_resolver(server: str | None) -> Resolver:
    """The resolver for ``--engine-dns-server`` (None: the system's)."""
    if not server:
        return SystemResolver()
    return NameserverResolver(*parse_server(server))


class Discovery:
    """The engine addresses to connect to: the fixed ones, and what each DNS name has
    now. :meth:`serve` resolves every ``refresh`` seconds and hands the whole list to
    ``apply`` whenever it changed."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        resolver: Resolver | None = None,
        refresh: float = DEFAULT_REFRESH,
    ) -> None:
        self.fixed: list[str] = []
        self.names: list[DnsName] = []
        for address in addresses:
            dns_name = parse_dns(address)
            if dns_name is None:
                self.fixed.append(address)
            elif dns_name not in self.names:
                self.names.append(dns_name)
        self.resolver = resolver or SystemResolver()
        self.refresh = refresh
        #: What each name resolved to last (a name never resolved: absent).
        self.found: dict[DnsName, list[str]] = {}
        #: Names whose last resolution failed (warned once per streak).
        self._failing: set[DnsName] = set()

    def addresses(self) -> list[str]:
        """Fixed addresses first, in their order, then each name's, in its order."""
        out = dict.fromkeys(self.fixed)
        for dns_name in self.names:
            for ip in self.found.get(dns_name, ()):
                out.setdefault(engine_address(ip, dns_name.port), None)
        return list(out)

    async def resolve_all(self) -> bool:
        """Resolve every name once (each bounded by :data:`RESOLVE_TIMEOUT`); True if
        what was found changed."""
        changed = False
        for dns_name in self.names:
            found: list[str] | None = None
            with trio.move_on_after(RESOLVE_TIMEOUT):
                found = await self.resolver.resolve(dns_name.name)
            if found is None:
                if dns_name not in self._failing:
                    self._failing.add(dns_name)
                    log.warning(
                        "cannot resolve %s now; keeping its %d engine(s) until it resolves",
                        dns_name.spec,
                        len(self.found.get(dns_name, ())),
                    )
                continue
            if dns_name in self._failing:
                self._failing.discard(dns_name)
                log.info("%s resolves again", dns_name.spec)
            found = sorted(found)  # getaddrinfo's order may change from one call to the next
            if len(found) > MAX_ADDRESSES:
                log.warning(
                    "%s has %d addresses; using the first %d",
                    dns_name.spec,
                    len(found),
                    MAX_ADDRESSES,
                )
                found = found[:MAX_ADDRESSES]
            if found != self.found.get(dns_name):
                log.info("%s: %s", dns_name.spec, ", ".join(found) or "no addresses")
                self.found[dns_name] = found
                changed = True
        return changed

    async def serve(
        self,
        apply: Callable[[list[str]], None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Resolve now, ``apply`` the addresses, report started; then every ``refresh``
        seconds resolve again and ``apply`` any change. Never returns."""
        await self.resolve_all()
        apply(self.addresses())
        task_status.started()
        if not self.names:
            return
        while True:
            await trio.sleep(self.refresh)
            if await self.resolve_all():
                apply(self.addresses())
