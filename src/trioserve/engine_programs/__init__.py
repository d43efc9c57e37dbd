"""The engines trioserve ships, as programs: the mock (``mock.py``, run by
``mock_program.py``: ``trioserve engine mock``) and vLLM (``vllm.py``: ``trioserve engine
vllm``; it alone imports vllm, lazily), with what their processes share (``process.py``:
the options every engine takes, signals, exiting with the parent, bind errors). They are
backends of the engine SDK (``sdk/``), which is the library a third party writes an engine
with and holds no engine of its own."""
