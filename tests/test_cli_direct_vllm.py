"""The direct vLLM path's start-up checks (``cli/direct_vllm.py``), without vLLM: what it
does not serve is refused before the engine starts, naming the path that serves it."""

from __future__ import annotations

import pytest

from trioserve.cli.direct_vllm import check_options
from trioserve.errors import CommandError


@pytest.mark.parametrize(
    "vllm_args",
    [
        ["--chat-template", "template.jinja"],
        ["--chat-template=template.jinja"],
        ["--trust-request-chat-template"],
        ["--enable-lora"],
        ["--tokenizer-mode", "mistral"],
    ],
)
def test_what_the_direct_path_does_not_serve_is_refused_at_start_naming_asyncllm(vllm_args):
    with pytest.raises(CommandError, match=r"use --vllm-path asyncllm$") as refused:
        check_options(["--max-model-len", "512", *vllm_args])
    assert refused.value.exit_status == 2


def test_the_options_it_serves_are_read():
    options = check_options(["--max-logprobs", "5", "--served-model-name", "a", "b"])
    assert (options.max_logprobs, options.served_model_name) == (5, ["a", "b"])
