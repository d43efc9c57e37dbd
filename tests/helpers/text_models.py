"""The tiny Llama's text assets (tools/tiny_llama.py ``--text-only``), built with
``tokenizers`` alone: what the text layer's tests and the tokenize routes' tests load."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def tiny_llama() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tiny_llama", ROOT / "tools" / "tiny_llama.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_text_model(directory: Path, *, harder: bool) -> Path:
    """The plain or the harder model's text assets in ``directory``."""
    return tiny_llama().build_text_only(directory, harder=harder)
