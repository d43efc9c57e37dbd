"""A DNS server on 127.0.0.1 whose answers a test sets and changes (dnslib for the
packets): A and AAAA records by name, NXDOMAIN for a name it does not know, and a
failing mode (SERVFAIL) for resolutions that must not change what a frontend knows."""

from __future__ import annotations

import ipaddress
import socket

import trio
from dnslib import AAAA, QTYPE, RCODE, RR, A, DNSRecord

#: Largest query read (a query for one name is far smaller).
MAX_QUERY = 4096


class DnsServer:
    def __init__(self) -> None:
        #: Addresses by name (no trailing dot, lower case); set them at will.
        self.records: dict[str, list[str]] = {}
        #: Answer SERVFAIL to everything while set.
        self.failing = False
        #: Queries answered so far.
        self.queries = 0
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def answer(self, data: bytes) -> bytes:
        query = DNSRecord.parse(data)
        reply = query.reply()
        name = str(query.q.qname).rstrip(".").lower()
        if self.failing:
            reply.header.rcode = RCODE.SERVFAIL
        elif name not in self.records:
            reply.header.rcode = RCODE.NXDOMAIN
        else:
            for text in self.records[name]:
                ip = ipaddress.ip_address(text)
                if query.q.qtype == QTYPE.A and ip.version == 4:
                    reply.add_answer(RR(query.q.qname, QTYPE.A, rdata=A(text), ttl=0))
                elif query.q.qtype == QTYPE.AAAA and ip.version == 6:
                    reply.add_answer(RR(query.q.qname, QTYPE.AAAA, rdata=AAAA(text), ttl=0))
        return reply.pack()

    async def serve(self, *, task_status: trio.TaskStatus[DnsServer]) -> None:
        with trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            await sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
            task_status.started(self)
            while True:
                data, peer = await sock.recvfrom(MAX_QUERY)
                try:
                    reply = self.answer(data)
                except Exception:  # not a query: ignore it, as a server would
                    continue
                self.queries += 1
                await sock.sendto(reply, peer)


async def start_dns_server(nursery: trio.Nursery, **records: list[str]) -> DnsServer:
    server = DnsServer()
    server.records.update(records)
    return await nursery.start(server.serve)
