"""The served models' text assets, by model name: what the HTTP layer reads to answer
``/tokenize``, ``/detokenize`` and the render routes (and what an engine link that takes
token ids uses to build its requests).

Filled by whoever knows a model's directory: ``trioserve run --tokenizer PATH`` (for any
engine: one entry for every model, :meth:`TextRegistry.set_default`), the direct vLLM link
(the model it serves, with the ``max_model_len`` its engine registered).
"""

from __future__ import annotations

import attrs

from .assets import ModelText
from .sampling import EngineLimits

#: The context length assumed when neither the engine nor the model says one.
FALLBACK_MAX_MODEL_LEN = 2048


@attrs.frozen
class ServedText:
    """One model's text assets and its engine's limits."""

    text: ModelText
    limits: EngineLimits


def limits_from_model(text: ModelText) -> EngineLimits:
    """Limits from the model's own files, for an engine that does not register any:
    config.json's ``max_position_embeddings``, else tokenizer_config.json's
    ``model_max_length``."""
    length = text.max_position_embeddings
    if length is None:
        value = text.tokenizer_config.get("model_max_length")
        length = value if isinstance(value, int) and 0 < value < 2**31 else None
    return EngineLimits(max_model_len=length or FALLBACK_MAX_MODEL_LEN)


@attrs.define
class TextRegistry:
    """Model name -> :class:`ServedText`, and a default for models not named."""

    by_model: dict[str, ServedText] = attrs.Factory(dict)
    default: ServedText | None = None

    def register(self, model: str, text: ModelText, limits: EngineLimits | None = None) -> None:
        self.by_model[model] = ServedText(text, limits or limits_from_model(text))

    def unregister(self, model: str) -> None:
        self.by_model.pop(model, None)

    def set_default(self, text: ModelText, limits: EngineLimits | None = None) -> None:
        self.default = ServedText(text, limits or limits_from_model(text))

    def get(self, model: str) -> ServedText | None:
        return self.by_model.get(model, self.default)
