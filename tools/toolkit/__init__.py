"""What the measuring tools in tools/ share, imported by them as a library (never run):

- ``processes``: spawning, pinning, waiting for, stopping and capping processes; measuring
  children that print JSON
- ``machine``: the machine's facts and the source state a run measured
- ``reports``: table cells, ratios, and where a tool's figures go (stdout, JSON, docs)
- ``progress``: the one-line status of a long run
- ``load``: the load generator (an HTTP client of its own, its json / stream / ttft / idle
  runs, CPU meters and percentiles); ``loadgen.py`` is its command line

The programs (``bench.py``, ``bench_vllm.py``, ``instructions.py``, ``wakeups.py``, ...)
import it as ``toolkit`` (tools/ is their directory, so the first entry of ``sys.path``);
the tests, from the repository's root, as ``tools.toolkit``. So its modules import each
other relatively, and none imports a program.
"""
