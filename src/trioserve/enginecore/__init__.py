"""vLLM's EngineCore boundary: trioserve as a direct client of vLLM's engine process, as
vLLM's own API server and its Rust frontend are (docs/engines.md).

- ``codec``: the wire structs, mirrored by hand from vLLM's; sans-io.
- ``events``: a request's queued and scheduled times, from its outputs' events.
- ``client``: the running client: outputs, aborts, utility calls, engine death.
- ``opening``: how a client opens: its sockets, the handshake with the engine.
- ``launcher``: vLLM's EngineCore started headless as a child process.
- ``server_options``, ``vllm_serve``: the few of vLLM's options a client reads, and vLLM's
  launcher as the child process runs it.

Knows trio, pyzmq and msgspec; never the HTTP layer, ``engine/`` or ``text/``.
"""
