"""The measuring tools: each a program run from the repository's root as
``python -m tools.NAME`` (``--help`` says what it measures), and ``tools.toolkit``, the
library they share. Importing this package imports nothing: a tool run in the vLLM venv
(``tools.tiny_llama``, ``tools.vllm_cli``) needs no more of it than itself."""
