"""Build a tiny Llama that vLLM can serve on a CPU, with no download.

Two layers, hidden 128, two attention heads sharing one KV head (head_dim 64: vLLM's CPU
attention refuses 16), weights drawn from a fixed seed and saved as safetensors, and a
byte-level BPE tokenizer trained with ``tokenizers`` on a few sentences, with a chat
template. Built twice, it is the same model: greedy answers are reproducible.

    python tools/tiny_llama.py DIR      # needs torch, transformers and tokenizers

Used by the vLLM tests (tests/vllm/conftest.py) and by ``tools/bench.py --vllm``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

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
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/tiny_llama.py DIR")
    print(build(sys.argv[1]))
