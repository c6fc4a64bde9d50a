"""Shared test settings: deterministic hypothesis profile, seeded torch, one data set cache,
and the xdist groups.

``make test`` runs pytest with ``-n 2 --dist loadgroup``: tests are handed to the two workers
one by one, whatever file they are in, so both stay busy to the end. Tests must therefore not
depend on which worker runs them or on what ran before (ephemeral ports, per-test tmp_path).
The only exception is :data:`ONE_WORKER`: modules whose tests share one expensive set-up
(a module fixture or cached runs), made once that way, or each use every core, which two of
them at once would oversubscribe.
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

# module (relative to the repository root) -> why its tests stay on one worker
ONE_WORKER = {
    "tests/chaos/test_quick.py": "two peer processes (the module fixture `peers`)",
    "tests/sim/test_reproductions.py": "the simulator runs `_run` caches",
    # measured: beside each other they took 100 s instead of 48 s, Ray's test 45 s, not 14 s
    "tests/sim/test_sweep.py": "process pools (local processes, Ray) of two, one per core",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put each :data:`ONE_WORKER` module's tests in one ``xdist_group`` (its path)."""
    root = Path(config.rootpath)
    for item in items:
        module = item.path.relative_to(root).as_posix()
        if module in ONE_WORKER:
            item.add_marker(pytest.mark.xdist_group(module))


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
