from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers.decoders import DecodeStream

from trioserve.text.assets import ModelText
from trioserve.text.detokenizer import (
    PRIMER_SEARCH,
    PRIMER_TOKENS,
    IncrementalDetokenizer,
    decode_primer,
)

TEXTS = [
    "Grüße aus Köln! Café, naïve, façade.",
    "日本語のテキストも少しあります。",
    "Emoji: 🙂 🚀 ✨ and symbols like € £ ¥ ©.",
    "The quick brown fox jumps over the lazy dog.",
    "中文测试：你好，世界！👩‍💻 👍🏽",  # noqa: RUF001
]
STOPS = ["fox", "。", "🚀", "ü", "lazy dog", "Zz", "e"]


def run(model, prompt, ids, chunks, *, stop, include, terminated=False, skip=True):
    d = IncrementalDetokenizer(
        model, prompt, stop=stop, include_stop_str_in_output=include, skip_special_tokens=skip
    )
    sent, matched, at = [], None, 0
    for size in chunks:
        new = ids[at : at + size]
        at += size
        last = at >= len(ids)
        matched = d.update(new, terminated and last)
        sent.append(d.next_text(finished=matched is not None or last))
        if matched is not None or last:
            break
    return "".join(sent), matched, list(d.token_ids)


def test_split_characters_never_stream_a_replacement_character(plain: ModelText):
    text = "漢字 🦀 日本語 Köln"  # 漢字 and 🦀 are not in the corpus: byte-level tokens
    ids = plain.encode(text, add_special_tokens=False)
    assert any("\ufffd" in plain.decode([i]) for i in ids)  # some token splits a character
    d = IncrementalDetokenizer(plain, [0])
    pieces = []
    for token in ids:
        d.update([token], False)
        pieces.append(d.next_text(finished=False))
    assert all("\ufffd" not in piece for piece in pieces)
    assert "".join(pieces) == text


def test_prompt_priming_keeps_the_leading_space(plain: ModelText):
    prompt = plain.encode("The quick", add_special_tokens=False)
    ids = plain.encode("The quick brown", add_special_tokens=False)[len(prompt) :]
    d = IncrementalDetokenizer(plain, prompt)
    d.update(ids, False)
    assert d.next_text(finished=True) == " brown"


def test_stop_string_cuts_text_and_tokens_after_it(plain: ModelText):
    ids = plain.encode("The quick brown fox jumps over", add_special_tokens=False)
    text, matched, kept = run(plain, [0], ids, [len(ids)], stop=["fox"], include=False)
    assert (text, matched) == ("The quick brown ", "fox")
    assert plain.decode(kept).startswith("The quick brown fox")  # the fox token stays
    assert len(kept) < len(ids)  # jumps over: dropped
    text, matched, _ = run(plain, [0], ids, [len(ids)], stop=["fox"], include=True)
    assert (text, matched) == ("The quick brown fox", "fox")


def test_stream_holds_back_what_a_stop_string_could_take(plain: ModelText):
    ids = plain.encode("Hello, how are you", add_special_tokens=False)
    d = IncrementalDetokenizer(plain, [0], stop=["you today"])
    streamed = ""
    for token in ids:
        d.update([token], False)
        streamed += d.next_text(finished=False)
        assert len(d.output_text) - len(streamed) <= len("you today") - 1
    assert streamed == d.output_text[: len(d.output_text) - 8]
    assert streamed + d.next_text(finished=True) == "Hello, how are you"


def test_stop_token_text_is_left_out_unless_included(harder: ModelText):
    end = harder.tokenizer.token_to_id("<|end|>")
    ids = [*harder.encode("Zürich", add_special_tokens=False), end]
    assert (
        run(harder, [0], ids, [len(ids)], stop=[], include=False, terminated=True, skip=False)[0]
        == "Zürich"
    )
    text = run(harder, [0], ids, [len(ids)], stop=[], include=True, terminated=True, skip=False)[0]
    assert text == "Zürich<|end|>"


def test_spaces_between_special_tokens_off_joins_added_tokens(harder: ModelText):
    ids = [harder.tokenizer.token_to_id(t) for t in ("<tool_call>", "</tool_call>")]
    on = IncrementalDetokenizer(harder, [0], skip_special_tokens=False)
    on.update(ids, False)
    off = IncrementalDetokenizer(
        harder, [0], skip_special_tokens=False, spaces_between_special_tokens=False
    )
    off.update(ids, False)
    assert off.text() == "<tool_call></tool_call>"
    assert on.text().replace(" ", "") == "<tool_call></tool_call>"


@settings(max_examples=150, deadline=None)
@given(
    text=st.sampled_from(TEXTS),
    stops=st.lists(st.sampled_from(STOPS), max_size=3, unique=True),
    include=st.booleans(),
    min_tokens=st.integers(0, 4),
    chunks=st.lists(st.integers(1, 5), min_size=1, max_size=64),
)
def test_streamed_text_equals_text_at_once_for_any_chunking(
    plain: ModelText, text, stops, include, min_tokens, chunks
):
    ids = plain.encode(text, add_special_tokens=False)
    sizes = []
    while sum(sizes) < len(ids):
        sizes.append(chunks[len(sizes) % len(chunks)])

    def detok():
        return IncrementalDetokenizer(
            plain, [0], stop=stops, include_stop_str_in_output=include, min_tokens=min_tokens
        )

    whole = detok()
    whole_stop = None
    # one token at a time, read at the end: what a non-streamed answer is
    for token in ids:
        whole_stop = whole.update([token], False)
        if whole_stop is not None:
            break
    streamed = detok()
    sent, stop_seen, at = "", None, 0
    for size in sizes:
        stop_seen = streamed.update(ids[at : at + size], False)
        at += size
        done = stop_seen is not None or at >= len(ids)
        piece = streamed.next_text(finished=done)
        assert "\ufffd" not in piece
        sent += piece
        if done:
            break
    assert stop_seen == whole_stop
    assert sent == whole.text()
    assert streamed.token_ids == whole.token_ids


def _steps(model: ModelText, primer: list[int], generated: list[int], skip: bool) -> list[str]:
    """What a decode stream primed with ``primer`` sends for each generated id (an error
    as its message)."""
    stream = DecodeStream(ids=list(primer), skip_special_tokens=skip)
    sent = []
    for token_id in generated:
        try:
            sent.append(repr(stream.step(model.tokenizer, token_id)))
        except Exception as exc:
            sent.append(f"error: {exc}")
    return sent


@settings(max_examples=400, deadline=None)
@given(data=st.data(), skip=st.booleans(), texts=st.lists(st.sampled_from(TEXTS), min_size=1))
def test_a_stream_primed_with_the_prompts_tail_sends_what_the_whole_prompt_would(
    harder: ModelText, data, skip, texts
):
    """vLLM primes its decode stream with the whole prompt; trioserve with a tail of it
    where a byte-level decode can be split (tokens that are parts of characters, special
    tokens skipped or not, ids of any kind): the text sent for every generated token is
    the same, the first one's included."""
    words = harder.encode(" ".join(texts), add_special_tokens=False)
    anything = st.integers(0, harder.vocab_size - 1)
    # A prompt cut anywhere in real text (characters split across tokens), or any ids.
    prompt = data.draw(
        st.one_of(
            st.integers(0, len(words)).map(lambda cut: words[:cut]),
            st.lists(anything, max_size=80),
            st.lists(st.sampled_from([*words, *harder.special_token_ids]), max_size=80),
        )
    )
    generated = data.draw(
        st.one_of(st.lists(anything, min_size=1, max_size=12), st.just(words[-12:] or [0]))
    )
    primer = decode_primer(harder, prompt, skip)
    assert primer == prompt[len(prompt) - len(primer) :]  # a tail
    assert _steps(harder, primer, generated, skip) == _steps(harder, prompt, generated, skip)


def test_a_long_prompt_primes_the_stream_with_a_short_tail(harder: ModelText):
    """The first token of an answer to a 100k-token prompt costs what it costs after a short
    one: the stream is not primed with the whole prompt."""
    prompt = harder.encode(" ".join(TEXTS) * 2000, add_special_tokens=False)
    assert len(prompt) > 100_000
    primer = decode_primer(harder, prompt, True)
    assert PRIMER_TOKENS <= len(primer) <= PRIMER_TOKENS + PRIMER_SEARCH
