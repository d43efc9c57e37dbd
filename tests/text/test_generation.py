"""One generation's outputs, token ids in, the answer out (text/generation.py): what both
vLLM paths answer with. Sans-io: engine outputs are fed by hand."""

from __future__ import annotations

from trioserve.text.assets import ModelText
from trioserve.text.generation import GenerationText
from trioserve.text.registry import ServedText
from trioserve.text.requests import prepare
from trioserve.text.sampling import EngineLimits

TEXT = "Grüße aus Köln! 日本語 🙂 and the lazy dog."


def generation(model: ModelText, task: str = "completion", **params: object) -> GenerationText:
    served = ServedText(model, EngineLimits(4096))
    inputs: dict[str, object] = {"prompt": "Once"}
    if task == "chat":
        inputs = {"messages": [{"role": "user", "content": "Hi"}]}
    ready = prepare(served, task, inputs, {"max_tokens": 100, **params}, stream=True)
    return GenerationText(model, task, ready.prompt.token_ids, ready.sampling)


def feed(gen: GenerationText, ids: list[int], final: str | None):
    """One id per step, ``final`` as the last step's finish reason; the deltas."""
    deltas = []
    for i, token in enumerate(ids):
        delta = gen.step([token], final if i == len(ids) - 1 else None, None)
        if delta is not None:
            deltas.append(delta)
            if delta.finish_reason is not None:
                break
    return deltas


def test_text_streams_whole_characters_and_ends_with_the_engines_reason(plain: ModelText):
    ids = plain.encode(TEXT, add_special_tokens=False)
    gen = generation(plain)
    deltas = feed(gen, ids, "length")
    assert "".join(d.text for d in deltas) == plain.decode(ids)
    assert all("\ufffd" not in d.text for d in deltas)
    assert [d.finish_reason for d in deltas][-1] == "length"
    assert not deltas[-1].stopped
    assert gen.completion_tokens == len(ids)


def test_a_stop_string_cuts_the_text_and_asks_for_the_engines_abort(plain: ModelText):
    ids = plain.encode(TEXT, add_special_tokens=False)
    gen = generation(plain, stop=["Köln"])
    deltas = feed(gen, ids, None)
    last = deltas[-1]
    assert last.finish_reason == "stop" and last.stopped  # the engine still generates
    assert last.stop_reason == "Köln"
    assert "".join(d.text for d in deltas) == "Grüße aus "
    assert gen.completion_tokens < len(ids)  # the tokens after the stop string are dropped


def test_the_stop_token_ends_with_stop_and_no_text_of_its_own(plain: ModelText):
    ids = plain.encode("the lazy dog", add_special_tokens=False)
    [eos, *_] = plain.sampling_defaults.eos_token_ids
    gen = generation(plain)
    deltas = []
    for i, token in enumerate([*ids, eos]):
        final = i == len(ids)
        delta = gen.step([token], "stop" if final else None, None, eos if final else None)
        if delta is not None:
            deltas.append(delta)
    assert deltas[-1].finish_reason == "stop" and not deltas[-1].stopped
    assert deltas[-1].stop_reason == eos
    assert "".join(d.text for d in deltas) == plain.decode(ids)


def test_an_engine_error_is_an_error_delta(plain: ModelText):
    gen = generation(plain)
    delta = gen.step([], "error", None)
    assert delta is not None and delta.error and delta.finish_reason == "error"


def test_logprobs_come_in_the_tasks_shape(plain: ModelText):
    ids = plain.encode("the lazy dog", add_special_tokens=False)
    completion = generation(plain, logprobs=1)
    chat = generation(plain, "chat", logprobs=True, top_logprobs=1)
    for gen in (completion, chat):
        rows = ([[ids[0], ids[1]]], [[-0.5, -1.5]], [1])
        delta = gen.step([ids[0]], None, rows)
        assert delta is not None and delta.logprobs is not None  # sent with their step
    later = completion.step([ids[1]], None, ([[ids[1]]], [[-0.25]], [1]))
    assert later is not None and later.logprobs["text_offset"][0] > 0  # carried on
    entries = chat.step([ids[1]], None, ([[ids[1]]], [[-0.25]], [1]))
    assert entries is not None and entries.logprobs[0]["logprob"] == -0.25


def test_the_kept_token_ids_come_with_their_step_when_returned(plain: ModelText):
    ids = plain.encode(TEXT, add_special_tokens=False)
    gen = generation(plain, stop=["Köln"], return_token_ids=True)
    deltas = feed(gen, ids, None)
    kept = [i for d in deltas for i in d.token_ids or ()]
    assert kept == ids[: gen.completion_tokens]  # none after the stop string
    assert all(d.token_ids is None for d in feed(generation(plain), ids, "length"))


def test_an_echo_without_generation_shows_neither_the_token_nor_its_logprobs(plain: ModelText):
    gen = generation(plain, echo=True, max_tokens=0, logprobs=1)
    token = plain.encode(" dog", add_special_tokens=False)[0]
    delta = gen.step([token], "length", ([[token]], [[-0.5]], [1]))
    assert delta is not None and (delta.text, delta.logprobs) == ("", None)
    assert delta.finish_reason == "length"


def test_the_first_token_begins_the_answer_even_without_text(plain: ModelText):
    # Part of a character: no text yet, but the answer has begun (the writers open the
    # client's stream, as vLLM's server sends its first chunk); later parts say nothing.
    ids = plain.encode("🙂🙂", add_special_tokens=False)
    assert len(ids) > 2  # each smile in parts
    gen = generation(plain)
    assert gen.step([], None, None) is None  # a prefill chunk: no token yet
    first = gen.step(ids[:1], None, None)
    assert first is not None and first.text == "" and first.finish_reason is None
    later = [gen.step([token], None, None) for token in ids[1:]]
    texts = [None if d is None else d.text for d in later]
    assert "" not in texts and "".join(t for t in texts if t) == "🙂🙂"  # no empty deltas
    last = gen.step([], "length", None)
    assert last is not None and last.finish_reason == "length"
