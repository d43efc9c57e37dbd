from __future__ import annotations

import json
from pathlib import Path

import pytest

from trioserve.errors import ChatTemplateError
from trioserve.http.errors import http_error
from trioserve.text.assets import ModelText, ModelTextError, SamplingDefaults


def test_harder_model_reads_special_tokens_defaults_and_two_eos_ids(harder: ModelText):
    assert harder.special_tokens_map["bos_token"] == "<s>"
    assert harder.special_tokens_map["eos_token"] == "</s>"
    assert "<|end|>" in harder.special_tokens_map["additional_special_tokens"]
    assert harder.eos_token_id == harder.tokenizer.token_to_id("</s>")
    end = harder.tokenizer.token_to_id("<|end|>")
    assert harder.sampling_defaults.eos_token_ids == (harder.eos_token_id, end)
    # max_new_tokens is vLLM's max_tokens
    assert harder.sampling_defaults.values == {
        "repetition_penalty": 1.05,
        "temperature": 0.7,
        "top_k": 40,
        "top_p": 0.9,
        "max_tokens": 48,
    }
    assert harder.max_position_embeddings == 8192
    assert harder.vocab_size == harder.tokenizer.get_vocab_size()


def test_chat_template_jinja_file_wins_over_tokenizer_config(tmp_path: Path, plain_dir: Path):
    for name in ("tokenizer.json", "config.json"):
        (tmp_path / name).write_bytes((plain_dir / name).read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "config"}))
    assert ModelText.load(tmp_path).chat_template == "config"
    (tmp_path / "chat_template.jinja").write_text("file")
    assert ModelText.load(tmp_path).chat_template == "file"


def test_named_templates_pick_tool_use_with_tools(tmp_path: Path, plain_dir: Path):
    (tmp_path / "tokenizer.json").write_bytes((plain_dir / "tokenizer.json").read_bytes())
    named = [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    model = ModelText.load(tmp_path)
    assert model.resolve_chat_template(None, tools=False) == "D"
    assert model.resolve_chat_template(None, tools=True) == "T"
    assert model.resolve_chat_template("tool_use", tools=False) == "T"


def test_a_model_without_a_template_is_a_400(tmp_path: Path, plain_dir: Path):
    (tmp_path / "tokenizer.json").write_bytes((plain_dir / "tokenizer.json").read_bytes())
    with pytest.raises(ChatTemplateError) as caught:
        ModelText.load(tmp_path).resolve_chat_template(None, tools=False)
    assert http_error(caught.value).status == 400  # what the client reads


def test_missing_or_broken_tokenizer_is_a_model_text_error(tmp_path: Path):
    with pytest.raises(ModelTextError, match=r"no tokenizer\.json"):
        ModelText.load(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelTextError):
        ModelText.load(tmp_path)


def test_generation_defaults_without_sampling_fields_are_empty():
    assert SamplingDefaults.from_config({"eos_token_id": 2}) == SamplingDefaults({}, (2,))
    assert SamplingDefaults.from_config({"eos_token_id": [2, 3], "top_p": None}).values == {}
