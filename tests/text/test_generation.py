"""One generation's outputs, token ids in, the answer out (text/generation.py): what both
vLLM paths answer with. Sans-io: engine outputs are fed by hand."""

from __future__ import annotations

from trioserve.text.assets import ModelText
from trioserve.text.generation import GenerationText
from trioserve.text.registry import ServedText
from trioserve.text.requests import prepare
from trioserve.text.sampling import EngineLimits

TEXT = "Grüße aus Köln! 日本語 🙂 and the lazy dog."


def generation(
    model: ModelText, task: str = "completion", *, stream: bool = True, **params: object
) -> GenerationText:
    served = ServedText(model, EngineLimits(4096))
    inputs: dict[str, object] = {"prompt": "Once"}
    if task == "chat":
        inputs = {"messages": [{"role": "user", "content": "Hi"}]}
    ready = prepare(served, task, inputs, {"max_tokens": 100, **params}, stream=stream)
    return GenerationText(model, task, ready)


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


def prompt_rows(model: ModelText, prompt: str) -> tuple[list[int], tuple]:
    """A prompt's ids, and the prompt logprobs' rows EngineCore would send for them (each
    position after the first: its token, then one more, 7)."""
    ids = model.encode(prompt, add_special_tokens=True)
    rows = (
        [[token, 7] for token in ids[1:]],
        [[-2.0, -1.0]] * (len(ids) - 1),
        [5] * (len(ids) - 1),
    )
    return ids, rows


def test_an_echo_without_generation_shows_neither_the_token_nor_its_logprobs(plain: ModelText):
    gen = generation(plain, echo=True, max_tokens=0, logprobs=1)
    prompt, rows = prompt_rows(plain, "Once")
    gen.add_prompt_rows(rows)
    token = plain.encode(" dog", add_special_tokens=False)[0]
    delta = gen.step([token], "length", ([[token]], [[-0.5]], [1]))
    assert delta is not None and delta.finish_reason == "length"
    assert delta.text == "Once"  # the prompt alone
    assert len(delta.logprobs["tokens"]) == len(prompt)  # the prompt's, not the token's


def test_the_prompts_details_come_with_the_first_delta_only(plain: ModelText):
    # The prompt's logprobs come with the prefill's chunks, before any token; the first
    # delta with tokens carries them, the echo (its logprobs first) and the prompt's ids.
    gen = generation(
        plain, echo=True, logprobs=1, prompt_logprobs=1, return_token_ids=True, stream=False
    )
    prompt, rows = prompt_rows(plain, "Once")
    gen.add_prompt_rows(([rows[0][0]], [rows[1][0]], [rows[2][0]]))  # two chunks
    assert gen.step([], None, None) is None
    gen.add_prompt_rows(tuple(column[1:] for column in rows))
    answer = plain.encode(" the lazy dog", add_special_tokens=False)
    first = gen.step(answer[:1], None, ([[answer[0]]], [[-0.5]], [1]))
    assert first is not None
    assert first.prompt_token_ids == prompt and first.token_ids == answer[:1]
    assert first.prompt_logprobs is not None and first.prompt_logprobs[0] is None
    assert list(first.prompt_logprobs[1]) == [str(prompt[1]), "7"]
    assert first.prompt_logprobs[1][str(prompt[1])]["rank"] == 5
    assert len(first.prompt_logprobs) == len(prompt)
    # A completion's echo is its prompt, none when the ids are returned (vLLM's); its
    # logprobs: the prompt's tokens (the first with none), then the answer's.
    assert first.text == plain.decode(answer[:1])
    tokens = first.logprobs["token_logprobs"]
    assert tokens[0] is None and len(tokens) == len(prompt) + 1
    offsets = first.logprobs["text_offset"]
    later = gen.step(answer[1:2], "length", ([[answer[1]]], [[-0.5]], [1]))
    assert later is not None and later.prompt_token_ids is None and later.prompt_logprobs is None
    assert later.logprobs["text_offset"][0] > offsets[-1]  # counted on from the echo's


def test_a_completions_echo_begins_the_answer_with_the_prompt(plain: ModelText):
    gen = generation(plain, echo=True)
    _, rows = prompt_rows(plain, "Once")
    gen.add_prompt_rows(rows)
    answer = plain.encode(" the lazy dog", add_special_tokens=False)
    deltas = feed(gen, answer, "length")
    assert "".join(d.text for d in deltas) == "Once" + plain.decode(answer)
    assert deltas[0].prompt_token_ids is not None  # streamed with them, asked or not


def test_without_prompt_details_asked_no_delta_carries_any(plain: ModelText):
    gen = generation(plain)
    _, rows = prompt_rows(plain, "Once")
    gen.add_prompt_rows(rows)  # (an engine would send none; they are ignored)
    ids = plain.encode(TEXT, add_special_tokens=False)
    deltas = feed(gen, ids, "length")
    assert all(d.prompt_token_ids is None and d.prompt_logprobs is None for d in deltas)
    assert "".join(d.text for d in deltas) == plain.decode(ids)


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
