"""Copies of a message made field by field (for speed: ``attrs.evolve`` introspects the class
on every call) keep every field: one added to the class and forgotten there fails here."""

from __future__ import annotations

import attrs

from trioserve.http.bodies.openai import Generation
from trioserve.protocol import Submit


def _distinct(cls: type) -> dict:
    """A value for each field of ``cls``, each different from its default."""
    return {f.name: f"<{f.name}>" for f in attrs.fields(cls)}


def test_submit_with_inputs_keeps_every_other_field():
    submit = Submit(**_distinct(Submit))
    copy = submit.with_inputs({"prompt": "x"})
    assert attrs.asdict(copy) == {**attrs.asdict(submit), "inputs": {"prompt": "x"}}


def test_generation_with_submit_keeps_every_other_field():
    generation = Generation(**_distinct(Generation))
    submit = Submit("id", "m", "chat", {})
    copy = generation.with_submit(submit)
    assert {f.name: getattr(copy, f.name) for f in attrs.fields(Generation)} == {
        **_distinct(Generation),
        "submit": submit,
    }
