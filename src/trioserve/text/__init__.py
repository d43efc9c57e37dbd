"""The text layer: a model's tokenizer, chat template, incremental detokenizer, stop
strings and sampling lowering, for engines that take token ids (vLLM's EngineCore), and for
the ``/tokenize`` and render routes. Sans-io and engine-free: it knows ``tokenizers`` and
``jinja2``, never trio, zmq or HTTP. See docs/architecture.md ("The text layer").

Modules: ``assets`` (:class:`~trioserve.text.assets.ModelText`, loaded once per model),
``template`` (chat templates as transformers renders them), ``prompts`` (token ids for a
chat or completion request, with vLLM's length rules), ``detokenizer`` (incremental, with
stop strings), ``stops``, ``sampling`` (OpenAI parameters lowered to vLLM's
``SamplingParams``, validated), ``logprobs`` (token strings), ``logprob_format`` (the
OpenAI shapes), ``requests`` (:func:`~trioserve.text.requests.prepare`: a request ready for a
token-id engine), ``registry`` (the served models' text assets); ``agents/`` holds the
tool-call and reasoning parsers.
"""
