"""What decoding one EngineCore step's outputs costs: trioserve's codec (msgspec, into typed
structs) against msgpack into lists, the alternative it was chosen over.

    python -m tools.bench_enginecore_codec [--outputs 64] [--rounds 10] [--per-round 2000]

A step of ``--outputs`` requests, one new token each (the steady state of a batch), encoded
as vLLM encodes it (array-like structs; this codec's encoder writes the same bytes), decoded
by each side and each output's id, tokens and finish reason read. CPU time per step
(``time.process_time``), min and median over rounds: the two sides alternate within each
round, so a noisy machine slows both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import msgpack
import msgspec

from trioserve.enginecore import codec


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench_enginecore_codec", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--outputs", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=2000)
    args = parser.parse_args()
    step = codec.EngineCoreOutputs(
        outputs=[
            codec.EngineCoreOutput(f"cmpl-{i:04d}-0123456789abcdef", [1234])
            for i in range(args.outputs)
        ],
        scheduler_stats=codec.SchedulerStats(num_running_reqs=args.outputs, kv_cache_usage=0.3),
        timestamp=1.0,
    )
    frames = [msgspec.msgpack.encode(step)]

    seen: list[object] = []

    def ours() -> None:
        for output in codec.decode_outputs(frames).outputs:
            seen.append((output.request_id, output.new_token_ids, output.finish_reason))
        seen.clear()

    def lists() -> None:
        for output in msgpack.unpackb(frames[0])[1]:
            seen.append((output[0], output[1], output[5]))
        seen.clear()

    sides = {"msgspec_structs": ours, "msgpack_lists": lists}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, run in sides.items():
            start = time.process_time()
            for _ in range(args.per_round):
                run()
            times[name].append((time.process_time() - start) / args.per_round * 1e6)
    report = {
        name: {"min_us": round(min(t), 1), "median_us": round(statistics.median(t), 1)}
        for name, t in times.items()
    }
    report["outputs_per_step"] = args.outputs  # type: ignore[assignment]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
