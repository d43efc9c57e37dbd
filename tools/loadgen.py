"""The load generator of ``tools/bench.py``: drives one frontend, measures, prints JSON.

Built not to be the bottleneck: uvloop with plain ``asyncio.Protocol`` callbacks (no
streams, no HTTP library), requests pre-encoded once, responses parsed only as far as
needed (status, content-length or chunked framing; tokens counted with ``bytes.count``).
It measures its own CPU time over every measuring window, and that of the frontend and
the engine (utime + stime from ``/proc/PID/stat``), so a run shows who was busy. All
traffic goes to 127.0.0.1; every mode is bounded in time.

Modes (one JSON object on stdout; progress on stderr with ``--progress``):

- ``json``: non-streaming chat completions on ``--concurrency`` keep-alive connections for
  ``--duration`` seconds after ``--warmup``: requests/s, latency p50/p99.
- ``stream``: ``--streams`` concurrent SSE streams whose engine produces
  ``--rate`` tokens/s each: token events relayed per second, inter-token latency p50/p99
  (gaps between a stream's consecutive tokens as the client reads them; tokens that arrive
  in one read count as gap 0 after the first).
- ``ttft``: one request at a time, alternately straight to the engine over ZeroMQ and
  through the frontend (blocking sockets both, same clock): time to first token of each.
  With ``--also-url``, several frontends take turns request by request (each after a
  request straight to the engine), so that they are compared under the same conditions.
- ``idle``: opens streams that stay silent (a huge ``mock_ttft_ms``) up to each of
  ``--levels``, waits until the engine holds them all (its pong's ``running``), samples
  the frontend's resident memory, then resets every connection and waits for the engine to
  see every abort.

    python -m tools.loadgen stream --url http://127.0.0.1:8000 --streams 256 --rate 20 \\
        --frontend-pid 1234 --engine-pid 1233

An ``https://`` URL speaks TLS (json, stream, idle), checking the server's certificate
against ``--ca-certs`` or, with ``--insecure-tls``, not at all.

The client is ``tools.toolkit.http_client``'s, the runs ``tools.toolkit.load``'s; this is their
command line.
"""

from __future__ import annotations

import argparse
import json
import ssl
from urllib.parse import urlsplit

import uvloop

from tools.toolkit import http_client, load
from tools.toolkit.processes import raise_fd_limit


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tools.loadgen", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("mode", choices=["json", "stream", "ttft", "idle"])
    parser.add_argument("--url", required=True, help="the frontend, http://127.0.0.1:PORT")
    parser.add_argument(
        "--also-url",
        action="append",
        default=[],
        help="ttft: another frontend, measured in turns with --url (repeatable)",
    )
    parser.add_argument("--engine", help="the engine's ZeroMQ address (ttft, idle)")
    parser.add_argument("--frontend-pid", type=int, help="for CPU and memory figures")
    parser.add_argument("--engine-pid", type=int, help="for CPU figures")
    parser.add_argument("--duration", type=float, default=5.0, help="measuring window, s")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring")
    parser.add_argument("--concurrency", type=int, default=1, help="json: connections")
    parser.add_argument("--max-tokens", type=int, default=16, help="json: tokens per answer")
    parser.add_argument("--streams", type=int, default=32, help="stream: concurrent streams")
    parser.add_argument("--rate", type=float, default=5.0, help="stream: tokens/s per stream")
    parser.add_argument(
        "--stream-tokens", type=int, default=64, help="stream: tokens per answer (max_tokens)"
    )
    parser.add_argument("--count", type=int, default=200, help="ttft: measured requests")
    parser.add_argument("--warmup-count", type=int, default=20, help="ttft: unmeasured first")
    parser.add_argument("--ttft-ms", type=float, default=10.0, help="ttft: the engine's own")
    parser.add_argument(
        "--ttft-tokens",
        type=int,
        default=1,
        help="ttft: tokens per answer (with more than 1, the first comes alone, then one a ms)",
    )
    parser.add_argument(
        "--levels",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[1000, 10000],
        help="idle: stream counts to sample memory at",
    )
    parser.add_argument("--batch", type=int, default=100, help="idle: connections per step")
    parser.add_argument("--settle", type=float, default=1.0, help="idle: seconds before sampling")
    parser.add_argument("--progress", action="store_true")
    parser.add_argument("--ca-certs", help="https: the CA that signed the server's certificate")
    parser.add_argument(
        "--insecure-tls", action="store_true", help="https: do not check the certificate"
    )
    args = parser.parse_args()
    if urlsplit(args.url).scheme == "https":
        if args.mode == "ttft":
            parser.error("ttft speaks plain HTTP only")
        if not (args.ca_certs or args.insecure_tls):
            parser.error("an https URL needs --ca-certs or --insecure-tls")
        tls = ssl.create_default_context(cafile=args.ca_certs)
        if args.insecure_tls:
            tls.check_hostname = False
            tls.verify_mode = ssl.CERT_NONE
        http_client.TLS = tls
    args.also = []
    for url in [args.url, *args.also_url]:
        split = urlsplit(url)
        if split.hostname not in ("127.0.0.1", "localhost"):
            parser.error("this tool only generates traffic to 127.0.0.1")
        args.also.append((split.hostname, split.port))
    (args.host, args.port), args.also = args.also[0], args.also[1:]
    if args.also and args.mode != "ttft":
        parser.error("--also-url is for ttft only")
    raise_fd_limit()
    if args.mode == "ttft":
        result = load.run_ttft(args)
    else:
        runners = {"json": load.run_json, "stream": load.run_stream, "idle": load.run_idle}
        result = uvloop.run(runners[args.mode](args))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
