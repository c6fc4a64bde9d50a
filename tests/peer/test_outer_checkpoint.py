"""A peer running the outer-optimizer family keeps its slow weights and outer optimizer state
in its checkpoints, and --resume continues the outer loop from them."""

from __future__ import annotations

from pathlib import Path

import torch

from peer.node import checkpoint as ckpt
from peer.node.training_state import algorithm_tensors

from .conftest import started_peer


async def test_slow_weights_and_outer_momentum_survive_a_restart(tmp_path: Path) -> None:
    settings = dict(mode="sync", algorithm="diloco", local_steps=2, checkpoint_dir=str(tmp_path))
    async with started_peer("a", **settings) as first:
        await first.run(steps=6)  # 3 outer steps alone: its own pseudo-gradient each time
    loaded = ckpt.load_latest(tmp_path)
    assert loaded is not None and loaded.step == 6
    saved = algorithm_tensors(loaded)
    assert set(saved) == {"phi", "outer.momentum_buffer"}
    assert float(saved["outer.momentum_buffer"].abs().max()) > 0
    torch.testing.assert_close(saved["phi"], loaded.tensors["flat"])  # theta <- phi
    async with started_peer("a", seed=7, resume=True, **settings) as second:
        tensors = second.gossip_state.tensors()
        for key, value in saved.items():
            torch.testing.assert_close(tensors[key], value)
