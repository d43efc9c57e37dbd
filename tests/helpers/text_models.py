"""The tiny Llama's text assets (``tools.tiny_llama``'s ``--text-only``), built with
``tokenizers`` alone: what the text layer's tests and the tokenize routes' tests load."""

from __future__ import annotations

from pathlib import Path

from tools import tiny_llama


def build_text_model(directory: Path, *, harder: bool) -> Path:
    """The plain or the harder model's text assets in ``directory``."""
    return tiny_llama.build_text_only(directory, harder=harder)
