from __future__ import annotations

from pathlib import Path

import pytest

from trioserve.cli import preflight
from trioserve.errors import CommandError
from trioserve.text.assets import ModelText
from trioserve.text.registry import FALLBACK_MAX_MODEL_LEN, TextRegistry, limits_from_model
from trioserve.text.sampling import EngineLimits


def test_a_registered_model_wins_over_the_default(plain: ModelText, harder: ModelText):
    texts = TextRegistry()
    assert texts.get("m") is None
    texts.set_default(plain)
    texts.register("m", harder, EngineLimits(300))
    assert texts.get("m").text is harder and texts.get("m").limits.max_model_len == 300
    assert texts.get("other").text is plain
    texts.unregister("m")
    assert texts.get("m").text is plain


def test_limits_come_from_the_model_when_no_engine_says(plain: ModelText):
    assert limits_from_model(plain).max_model_len == 8192  # config.json
    bare = ModelText(plain.tokenizer)
    assert limits_from_model(bare).max_model_len == FALLBACK_MAX_MODEL_LEN


def test_a_bad_tokenizer_directory_is_one_line_at_start(tmp_path: Path):
    with pytest.raises(CommandError, match=r"--tokenizer .*no tokenizer\.json"):
        preflight.check_tokenizer(str(tmp_path))
    preflight.check_tokenizer("")  # not given: nothing to check
