"""What a stored response costs in RSS, against what the response store counts for it.

Fills a :class:`~trioserve.http.responses_store.ResponseStore` in this process with
responses made the way the routes make them (``parse_response`` for the echo, the
writers' own events, the background writer for background ones), for each shape asked
for, and reports the growth of this process's RSS per response beside the bytes the
store counted per response (each shape in a fresh process: memory freed by one would
hide another's growth). Counted must be at least RSS for every shape: that is what
``RECORD_OVERHEAD``, ``EVENT_SLOT`` and ``parts_bytes`` are set from.

    python -m tools.store_overhead                 # the default shapes
    python -m tools.store_overhead --tokens 16 2000 --count 20000
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess

import trio
import trio.testing

from tools.toolkit.processes import ROOT, tool_command
from trioserve.http.bodies.responses import parse_response
from trioserve.http.responses_store import RecordWriter, ResponseStore, StoredResponse
from trioserve.http.writers.responses import ResponseEvents
from trioserve.protocol import OutputItem, Usage


def rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def echo_of(n: int, instructions: int) -> dict:
    body = {"input": "hello", "max_output_tokens": 16, "user": f"user-{n}"}
    if instructions:
        body["instructions"] = "i" * instructions
    return parse_response(body, "r", lambda model: "mock").echo


def unbounded_store() -> ResponseStore:
    return ResponseStore(ttl=1e9, max_events=10**9, max_background=10**9, max_bytes=2**50)


async def foreground(count: int, tokens: int, instructions: int) -> tuple[float, float]:
    store = unbounded_store()
    gc.collect()
    before = rss()
    for n in range(count):
        events = ResponseEvents(f"resp_{n:032x}", "mock", echo_of(n, instructions))
        for t in range(tokens):
            events.add_text(f" w{t}")
        events.complete("length", Usage(5, tokens))
        store.keep(events, None)
    gc.collect()
    return (rss() - before) / count, store.bytes / count


async def background(count: int, tokens: int, instructions: int) -> tuple[float, float]:
    store = unbounded_store()
    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        gc.collect()
        before = rss()
        for n in range(count):
            events = ResponseEvents(
                f"resp_{n:032x}", "mock", echo_of(n, instructions), background=True
            )
            record = StoredResponse(events, None, None)
            store.start_background(record, record.done.wait)
            writer = RecordWriter(store, record)
            for t in range(tokens):
                await writer.write([OutputItem(record.id, t, data=f" w{t}")])
            end = OutputItem(record.id, tokens, finish_reason="length", usage=Usage(5, tokens))
            await writer.write([end])
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        figures = (rss() - before) / count, store.bytes / count
        nursery.cancel_scope.cancel()
    return figures


async def one(kind: str, count: int, tokens: int, instructions: int) -> None:
    run = foreground if kind == "foreground" else background
    grown, counted = await run(count, tokens, instructions)
    print(json.dumps([grown, counted]))


def main(args: argparse.Namespace) -> None:
    print(
        "| kind | tokens | instructions | responses | RSS per response | counted | counted / RSS |"
    )
    print("|---|---|---|---|---|---|---|")
    for kind, scale in (("foreground", 1), ("background", 5)):
        for tokens in args.tokens:
            for instructions in args.instructions:
                count = max(args.count // scale // max(1, tokens // 100), 200)
                shape = [kind, str(count), str(tokens), str(instructions)]
                out = subprocess.run(
                    [*tool_command("store_overhead"), "--one", *shape],
                    cwd=ROOT,
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                grown, counted = json.loads(out)
                print(
                    f"| {kind} | {tokens} | {instructions} | {count} | {grown:,.0f} B | "
                    f"{counted:,.0f} B | {counted / grown:.2f} |"
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m tools.store_overhead", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--tokens", type=int, nargs="+", default=[16, 200, 2000])
    parser.add_argument("--instructions", type=int, nargs="+", default=[0, 10_000])
    parser.add_argument("--count", type=int, default=20_000, help="responses of 16-100 tokens")
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.one:
        kind, count, tokens, instructions = arguments.one
        trio.run(one, kind, int(count), int(tokens), int(instructions))
    else:
        main(arguments)
