"""Build a tiny Llama that vLLM can serve on a CPU, with no download.

Two layers, hidden 128, two attention heads sharing one KV head (head_dim 64: vLLM's CPU
attention refuses 16), weights drawn from a fixed seed and saved as safetensors, and a
byte-level BPE tokenizer trained with ``tokenizers`` on a few sentences, with a chat
template. Built twice, it is the same model: greedy answers are reproducible.

    python -m tools.tiny_llama DIR            # needs torch, transformers and tokenizers
    python -m tools.tiny_llama --harder DIR   # the harder model (below)
    python -m tools.tiny_llama --text-only [--harder] DIR   # its text assets; tokenizers only

Used by the vLLM tests (tests/vllm/conftest.py) and by ``python -m tools.bench --vllm``.

**The harder model** (``--harder``) is what the text layer's parity tests serve: added
special tokens for the roles and tool calls, a chat template with a default system prompt,
tools rendered with ``tojson``, ``raise_exception`` for an unknown role, a ``namespace``, and
content parts looped over (vLLM's "openai" content format); a ``generation_config.json``
with non-default sampling defaults and two EOS ids; a corpus with accents, CJK and emoji. The
default model stays as it was (the vLLM suite's greedy answers depend on it).

``--text-only`` writes what the text layer reads (tokenizer.json, tokenizer_config.json,
chat_template.jinja, generation_config.json, config.json) without torch or transformers:
the text tests build it in the test environment.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: --text-only needs tokenizers alone
    import tokenizers

SEED = 1234
VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<s>", "</s>", "<unk>"]
#: Context length: long enough for answers that run for seconds (abort tests).
MAX_POSITIONS = 8192

#: A few sentences for the tokenizer; non-ASCII text too, so that some characters are split
#: across byte-level tokens (the detokenizer must join them back).
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, how are you today? I am fine, thank you.",
    "Tell me a story about a robot who learned to paint.",
    "Structured concurrency: every request is a nursery, and every end sends one abort.",
    "Grüße aus Köln! Café, naïve, façade, São Paulo, Zürich.",
    "日本語のテキストも少しあります。",
    "Emoji: 🙂 🚀 ✨ and symbols like € £ ¥ ©.",
    "user assistant system: you are a helpful assistant.",
    '1 2 3 4 5 6 7 8 9 10 100 1000 {"key": "value", "list": [1, 2, 3]}',
]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


#: The harder model's added tokens: special (skipped with skip_special_tokens) and not.
HARDER_SPECIAL_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>"]
HARDER_ADDED_TOKENS = ["<tool_call>", "</tool_call>"]
HARDER_CORPUS = [
    *CORPUS,
    "Ünïcödé façade: crème brûlée, jalapeño, smörgåsbord, Ærøskøbing.",
    "中文测试：你好，世界！한국어 텍스트도 있습니다. 日本語のテキスト。",  # noqa: RUF001
    "Emoji sequences: 👩‍💻 👍🏽 🇫🇷 🏳️‍🌈 and ❤️🔥.",
    "The weather in Paris is sunny. Call get_weather with a city.",
]
HARDER_CHAT_TEMPLATE = """\
{%- set ns = namespace(system=none, turns=0) -%}
{%- if messages[0]['role'] == 'system' -%}
  {%- set ns.system = messages[0]['content'] -%}
  {%- set loop_messages = messages[1:] -%}
{%- else -%}
  {%- set loop_messages = messages -%}
{%- endif -%}
{{ bos_token }}<|system|>
{%- if ns.system is string %}{{ ns.system }}
{%- elif ns.system %}{% for part in ns.system %}{{ part['text'] }}{% endfor %}
{%- else %}You are a helpful assistant.{% endif %}
{%- if tools %}

Tools:
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
{%- endif %}<|end|>
{%- for message in loop_messages %}
  {%- if message['role'] not in ['user', 'assistant', 'tool'] -%}
    {{ raise_exception('Unknown role: ' ~ message['role']) }}
  {%- endif %}
  {%- set ns.turns = ns.turns + 1 %}
{{ '\\n<|' ~ message['role'] ~ '|>\\n' }}
  {%- if message['content'] is string %}{{ message['content'] }}
  {%- else %}
    {%- for part in message['content'] %}
      {%- if part['type'] == 'text' %}{{ part['text'] }}{% endif %}
    {%- endfor %}
  {%- endif %}
  {%- if message['tool_calls'] is defined %}
    {%- for call in message['tool_calls'] -%}
      <tool_call>{{ call['function'] | tojson }}</tool_call>
    {%- endfor %}
  {%- endif %}<|end|>
{%- endfor %}
{%- if ns.turns == 0 %}{{ raise_exception('No messages to answer') }}{% endif %}
{%- if add_generation_prompt %}{{ '\\n<|assistant|>\\n' }}{% endif %}"""
#: Non-default sampling defaults (vLLM applies them unless a request sets its own).
HARDER_GENERATION = {
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 40,
    "repetition_penalty": 1.05,
    "max_new_tokens": 48,
}


def build_tokenizer(harder: bool = False) -> tokenizers.Tokenizer:
    """The tokenizer (``tokenizers`` only), trained on the corpus: the same every time."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    special = SPECIAL_TOKENS + (HARDER_SPECIAL_TOKENS if harder else [])
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE + (256 if harder else 0),
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(HARDER_CORPUS if harder else CORPUS, trainer=trainer)
    if harder:
        tokenizer.add_tokens(
            [tokenizers.AddedToken(t, normalized=False) for t in HARDER_ADDED_TOKENS]
        )
    return tokenizer


def text_assets(tokenizer: tokenizers.Tokenizer, harder: bool) -> dict[str, object]:
    """The JSON files besides tokenizer.json, by name (what transformers would save)."""
    eos = tokenizer.token_to_id("</s>")
    bos = tokenizer.token_to_id("<s>")
    tokenizer_config: dict[str, object] = {
        "backend": "tokenizers",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": MAX_POSITIONS,
        "tokenizer_class": "TokenizersBackend",
    }
    generation: dict[str, object] = {"bos_token_id": bos, "eos_token_id": eos}
    if harder:
        tokenizer_config["extra_special_tokens"] = HARDER_SPECIAL_TOKENS
        generation = {**generation, **HARDER_GENERATION}
        generation["eos_token_id"] = [eos, tokenizer.token_to_id("<|end|>")]
    return {"tokenizer_config.json": tokenizer_config, "generation_config.json": generation}


def build_text_only(directory: str | Path, harder: bool = False) -> Path:
    """The text assets alone (no weights): tokenizers only, no torch or transformers."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(harder)
    tokenizer.save(str(out / "tokenizer.json"))
    for name, value in text_assets(tokenizer, harder).items():
        (out / name).write_text(json.dumps(value, indent=2))
    (out / "chat_template.jinja").write_text(HARDER_CHAT_TEMPLATE if harder else CHAT_TEMPLATE)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": tokenizer.get_vocab_size(),
        "max_position_embeddings": MAX_POSITIONS,
        "bos_token_id": tokenizer.token_to_id("<s>"),
        "eos_token_id": tokenizer.token_to_id("</s>"),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def build_harder(directory: str | Path) -> Path:
    """The harder model: its text assets, then weights for its vocabulary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = build_text_only(directory, harder=True)
    config_json = json.loads((out / "config.json").read_text())
    config = LlamaConfig(
        vocab_size=config_json["vocab_size"],
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=config_json["bos_token_id"],
        eos_token_id=config_json["eos_token_id"],
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
    model.save_pretrained(out, safe_serialization=True)
    # save_pretrained writes its own generation_config.json: put the harder one back.
    tokenizer_assets = text_assets(build_tokenizer(True), True)
    (out / "generation_config.json").write_text(
        json.dumps(tokenizer_assets["generation_config.json"], indent=2)
    )
    return out


def build(directory: str | Path) -> Path:
    """Write the model and tokenizer into ``directory`` (created); returns it."""
    import tokenizers
    import torch
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = tokenizers.Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for parameter in model.parameters():
            # Larger than the default init, so that greedy decoding wanders across the
            # vocabulary (multi-byte characters included) instead of repeating one token.
            parameter.normal_(0.0, 0.2)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": fast.bos_token_id, "eos_token_id": fast.eos_token_id})
    )
    return out


if __name__ == "__main__":
    flags = {a for a in sys.argv[1:] if a.startswith("--")}
    paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(paths) != 1 or flags - {"--harder", "--text-only"}:
        sys.exit("usage: python -m tools.tiny_llama [--harder] [--text-only] DIR")
    if "--text-only" in flags:
        print(build_text_only(paths[0], harder="--harder" in flags))
    elif "--harder" in flags:
        print(build_harder(paths[0]))
    else:
        print(build(paths[0]))
