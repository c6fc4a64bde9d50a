"""Generated data sets (MNIST-1D) go to one temporary cache folder for the whole session,
never to the user's ~/.cache; CLI subprocesses inherit it through GOSSIPNET_CACHE."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def _dataset_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("gossipnet-cache")
    previous = os.environ.get("GOSSIPNET_CACHE")
    os.environ["GOSSIPNET_CACHE"] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop("GOSSIPNET_CACHE", None)
    else:
        os.environ["GOSSIPNET_CACHE"] = previous
