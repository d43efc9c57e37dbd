"""What the measuring tools in ``tools`` share, imported by them as a library (never run):

- ``processes``: spawning, pinning, waiting for, stopping and capping processes; measuring
  children that print JSON
- ``machine``: the machine's facts and the source state a run measured
- ``reports``: table cells, ratios, and where a tool's figures go (stdout, JSON, docs)
- ``progress``: the one-line status of a long run
- ``procfs``: what /proc says: CPU seconds of a process or its tree, resident memory, the
  cores' busy time, and ``CpuMeter`` over a measuring window
- ``http_client``: the load generator's HTTP/1.1 client (an ``asyncio.Protocol`` and an
  incremental response parser)
- ``load``: the load generator's json / stream / ttft / idle runs and percentiles;
  ``tools.loadgen`` is their command line

The programs (``tools.bench``, ``tools.bench_vllm``, ``tools.instructions``, ...) and the
tests import it as ``tools.toolkit``, from the repository's root; its modules import each
other relatively, and none imports a program.
"""
