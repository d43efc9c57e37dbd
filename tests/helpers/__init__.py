"""What the tests share, one module a subject; fixtures live in the conftest.py files.

- ``waiting``: the hang guard and ``wait_until``;
- ``frontends``: the mock engine and a frontend in-process (``start_engine``,
  ``start_frontend``, the servers the HTTP tests run on), what the engine received;
- ``http``: raw requests and reads on a socket, the ``/health`` poll, SSE events;
- ``http1``: a small ASGI app on the built-in server alone; ``http1_fuzz``: the generated
  traffic of the fuzz tests (``tools/fuzz_http.py`` runs it too);
- ``websocket``, ``api_keys``, ``media``: the WebSocket protocol's messages, keyed
  frontends, PNG checks;
- ``transport``: checks for a socket owner; ``fake_engine``: an engine driven by hand;
  ``zmtp_peer``: an engine's side of ZMTP by hand (NULL's bytes, a CurveZMQ server), to
  drive the frontend's framer without a socket; ``zmtp_fuzz``: the generated engine
  traffic and the properties of the ZMTP fuzz tests (``tools/fuzz_zmtp.py`` runs them too);
- ``processes``, ``nginx``, ``rolling``: trioserve as real processes, behind nginx;
- ``vllm``, ``vllm_session``: the real-engine tests of tests/vllm.
"""
