"""Shared test settings: deterministic hypothesis profile, seeded torch, one data set cache.

``make test`` runs pytest with ``-n 2 --dist load``: tests are handed to the two workers one
by one, whatever file they are in, so both stay busy to the end. Tests must therefore not
depend on which worker runs them or on what ran before (ephemeral ports, per-test tmp_path);
a module fixture is set up once per worker that runs the module's tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "gossipnet",
    deadline=None,
    derandomize=True,
    max_examples=50,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gossipnet"))


@pytest.fixture(autouse=True, scope="session")
def dataset_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Generated data sets (MNIST-1D) go to one temporary folder for the whole run, never to
    the user's ~/.cache; CLI subprocesses and notebook kernels inherit it through
    ``GOSSIPNET_CACHE``. The xdist workers of one run share it (they sit side by side under
    the run's base temporary folder): a data set is generated once per run, and the cache's
    atomic writes make two workers generating the same one at once harmless."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder = base / "gossipnet-cache"
    folder.mkdir(exist_ok=True)
    previous = os.environ.get("GOSSIPNET_CACHE")
    os.environ["GOSSIPNET_CACHE"] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop("GOSSIPNET_CACHE", None)
    else:
        os.environ["GOSSIPNET_CACHE"] = previous


@pytest.fixture(autouse=True)
def _torch_seed_and_threads():
    """Every test starts from the same torch seed and a single intra-op thread.

    One thread keeps the two-core CI machine from oversubscribing when pytest-xdist
    runs two workers.
    """
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    yield
