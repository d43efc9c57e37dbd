"""What a long prompt costs the text layer, and whether it stalls other Python work.

    python -m tools.bench_tokenize [--model DIR] [--tokens 100000] [--rounds 5]

Builds the harder tiny Llama's text assets (``tools.tiny_llama``'s ``--text-only``) unless a
model directory is given, makes a prompt of about ``--tokens`` tokens from varied text
(accents, CJK, emoji), and reports, as medians over the rounds:

- encode: ``ModelText.encode`` of the prompt (a completion), and the chat path (template
  rendering, then encoding);
- a short chat prepared as the direct vLLM path prepares it, in the event loop and through a
  worker thread: CPU per request, what the hop to the thread costs (run it with
  ``taskset -c 0``: one core, as the bench pins a frontend);
- the GIL: a pure-Python loop counts on the main thread while another thread encodes the
  prompt; its rate, as a ratio to its rate alone in the same run, says how much of the
  encode held the GIL (1.0: none; the machine's other load shows as noise on both sides),
  for ``ModelText.encode`` (``encode_batch_fast``) and, for reference, ``Tokenizer.encode``
  (which holds the GIL throughout).

Figures go to docs/benchmarks.md ("Tokenizing a long prompt"); no thresholds here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

TEXT = (
    "The quick brown fox jumps over the lazy dog. Grüße aus Köln! Café, naïve, façade. "
    "日本語のテキストも少しあります。中文测试 漢字 한국어 텍스트. Emoji: 🙂 🚀 ✨ 👩‍💻 👍🏽. "
    '{"key": "value", "list": [1, 2, 3]} 1 2 3 4 5 6 7 8 9 10 100 1000\n'
)


def _count_for(seconds: float) -> float:
    """Iterations of a pure-Python loop per second, for ``seconds``."""
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(1000):
            n += 1
    return n / seconds


def _short_chat_costs(model: object, count: int = 3000) -> dict[str, float]:
    """CPU per request (this process, every thread) of preparing a short chat as the direct
    vLLM path does, in the event loop and through a worker thread: what the hop costs,
    against the work itself (``text.requests.small_enough_inline`` chooses between them).
    Pin to one core (``taskset -c 0``), as the bench pins a frontend, for the figure a
    frontend pays."""
    import trio

    from trioserve.links.vllm import VllmText
    from trioserve.protocol import Submit
    from trioserve.text.sampling import EngineLimits

    text = VllmText(model, EngineLimits(4096))  # type: ignore[arg-type]
    chat = [{"role": "user", "content": "Write a short story about a robot in the rain."}]
    message = Submit("r", "m", "chat", {"messages": chat}, {"max_tokens": 16})
    figures: dict[str, list[float]] = {"inline": [], "thread": []}

    async def measure() -> None:
        for _ in range(2):
            for mode in figures:
                start = time.process_time()
                for _ in range(count):
                    if mode == "thread":
                        await trio.to_thread.run_sync(text.prepare_now, message)
                    else:
                        text.prepare_now(message)
                        await trio.lowlevel.checkpoint()
                figures[mode].append((time.process_time() - start) / count)

    trio.run(measure)
    return {
        f"short_chat_prepared_{mode}_cpu_us": round(min(values) * 1e6, 1)
        for mode, values in figures.items()
    }


def main() -> None:
    from tools.tiny_llama import build_text_only
    from trioserve.text.assets import ModelText
    from trioserve.text.prompts import chat_prompt

    parser = argparse.ArgumentParser(
        prog="python -m tools.bench_tokenize", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", help="a model directory (default: the harder tiny Llama)")
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        directory = args.model or build_text_only(Path(tmp) / "harder", harder=True)
        model = ModelText.load(directory)
        per_copy = len(model.encode(TEXT, add_special_tokens=False))
        prompt = TEXT * max(1, args.tokens // per_copy)
        messages = [{"role": "user", "content": prompt}]
        count = len(model.encode(prompt, add_special_tokens=True))

        encode, chat, alone, beside, plain_encode, beside_plain = [], [], [], [], [], []
        for _ in range(args.rounds):
            t = time.perf_counter()
            model.encode(prompt, add_special_tokens=True)
            encode.append(time.perf_counter() - t)
            t = time.perf_counter()
            chat_prompt(model, messages)
            chat.append(time.perf_counter() - t)
            window = max(encode[-1], 0.05)
            alone.append(_count_for(window))
            worker = threading.Thread(
                target=lambda: [model.encode(prompt, add_special_tokens=True) for _ in range(3)]
            )
            worker.start()
            beside.append(_count_for(window))
            worker.join()
            t = time.perf_counter()
            model.tokenizer.encode(prompt)
            plain_encode.append(time.perf_counter() - t)
            worker = threading.Thread(
                target=lambda: [model.tokenizer.encode(prompt) for _ in range(3)]
            )
            worker.start()
            beside_plain.append(_count_for(window))
            worker.join()

    result = {
        "prompt_tokens": count,
        "prompt_chars": len(prompt),
        "encode_ms": round(statistics.median(encode) * 1e3, 2),
        "encode_us_per_1k_tokens": round(statistics.median(encode) / count * 1e9, 1),
        "chat_render_and_encode_ms": round(statistics.median(chat) * 1e3, 2),
        "python_loop_rate_while_encoding_in_a_thread": round(
            statistics.median(b / a for a, b in zip(alone, beside, strict=True)), 3
        ),
        "tokenizer_encode_ms": round(statistics.median(plain_encode) * 1e3, 2),
        "python_loop_rate_while_tokenizer_encode_in_a_thread": round(
            statistics.median(b / a for a, b in zip(alone, beside_plain, strict=True)), 3
        ),
        "rounds": args.rounds,
        **_short_chat_costs(model),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
