"""vLLM's EngineCore boundary: trioserve as a direct client of vLLM's engine process, as
vLLM's own API server and its Rust frontend are (docs/engines.md).

- ``codec``: the wire structs, mirrored by hand from vLLM's; sans-io.
- ``client``: the sockets, the handshake, outputs, aborts, utility calls, engine death.
- ``launcher``: vLLM's EngineCore started headless as a child process.

Knows trio, pyzmq and msgspec; never the HTTP layer, ``engine/`` or ``text/``.
"""
