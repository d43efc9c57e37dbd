"""The text layer's test models: the tiny Llama's text assets, once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.text_models import build_text_model
from trioserve.text.assets import ModelText


@pytest.fixture(scope="session")
def plain_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_text_model(tmp_path_factory.mktemp("plain"), harder=False)


@pytest.fixture(scope="session")
def harder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_text_model(tmp_path_factory.mktemp("harder"), harder=True)


@pytest.fixture(scope="session")
def plain(plain_dir: Path) -> ModelText:
    return ModelText.load(plain_dir)


@pytest.fixture(scope="session")
def harder(harder_dir: Path) -> ModelText:
    return ModelText.load(harder_dir)
