"""Shared test settings: deterministic hypothesis profile, seeded torch."""

from __future__ import annotations

import os

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
