"""The text layer's test models: the tiny Llama's text assets (tools/tiny_llama.py
``--text-only``), built with ``tokenizers`` alone, once per session."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from trioserve.text.assets import ModelText

ROOT = Path(__file__).resolve().parents[2]


def _tiny_llama():
    spec = importlib.util.spec_from_file_location("tiny_llama", ROOT / "tools" / "tiny_llama.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def plain_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny_llama().build_text_only(tmp_path_factory.mktemp("plain"), harder=False)


@pytest.fixture(scope="session")
def harder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny_llama().build_text_only(tmp_path_factory.mktemp("harder"), harder=True)


@pytest.fixture(scope="session")
def plain(plain_dir: Path) -> ModelText:
    return ModelText.load(plain_dir)


@pytest.fixture(scope="session")
def harder(harder_dir: Path) -> ModelText:
    return ModelText.load(harder_dir)
