"""What the measuring tools in tools/ share, imported by them as a library (never run):

- ``processes``: spawning, pinning, waiting for, stopping and capping processes; measuring
  children that print JSON
- ``machine``: the machine's facts and the source state a run measured
- ``reports``: table cells, ratios, and where a tool's figures go (stdout, JSON, docs)
- ``progress``: the one-line status of a long run

The programs (``bench.py``, ``bench_vllm.py``, ``instructions.py``, ``wakeups.py``, ...)
import it as ``toolkit`` (tools/ is their directory, so the first entry of ``sys.path``).
"""
