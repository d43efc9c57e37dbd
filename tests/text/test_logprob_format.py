from __future__ import annotations

from trioserve.text.assets import ModelText
from trioserve.text.logprob_format import chat_logprobs, completion_logprobs, position
from trioserve.text.logprobs import token_strings


def test_sampled_token_first_then_the_top_ones_floored(plain: ModelText):
    fox, dog = plain.encode(" fox", add_special_tokens=False)[0], 5
    step = position(plain, [fox, dog], [-0.5, -float("inf")], 2, 1, [])
    [entry] = chat_logprobs([fox], [step], 1)
    assert entry["token"] == " fox" and entry["logprob"] == -0.5
    assert entry["bytes"] == list(b" fox")
    assert [t["logprob"] for t in entry["top_logprobs"]] == [-0.5]  # top_logprobs=1
    [full] = chat_logprobs([fox], [step], -1)
    assert full["top_logprobs"][1]["logprob"] == -9999.0


def test_a_sampled_token_among_the_top_ones_is_listed_once(plain: ModelText):
    step = position(plain, [7, 7, 9], [-1.0, -1.0, -2.0], 5, 2, [])
    assert list(step) == [7, 9] and step[7][1] == 1  # the top entry's rank


def test_completion_offsets_run_on_from_the_initial_one(plain: ModelText):
    ids = plain.encode("The quick brown", add_special_tokens=False)
    steps, context = [], []
    for token in ids:
        steps.append(position(plain, [token], [-1.0], 1, 0, context))
        context.append(token)
    out = completion_logprobs(ids, steps, 0, initial_offset=10)
    lengths = [len(t) for t in out["tokens"]]
    assert out["text_offset"][0] == 10
    assert out["text_offset"][1:] == [10 + sum(lengths[: i + 1]) for i in range(len(ids) - 1)]
    assert "".join(out["tokens"]) == "The quick brown"


def test_token_ids_spelling(plain: ModelText):
    assert token_strings(plain, [5, 6], [], as_token_ids=True) == ["token_id:5", "token_id:6"]
