"""A networked peer's dropout follows its seed: :class:`peer.node.trainer.Trainer` with a seed
takes the same first steps in two fresh processes, whatever torch's global generator holds.

(The simulator's side is ``tests/sim/test_determinism.py``.)
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from peer.node.trainer import Trainer

STEPS = textwrap.dedent(
    """
    import hashlib, os, sys
    import torch
    from torch import nn
    from peer.node.trainer import Trainer

    torch.manual_seed(0)  # the initial weights
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 3))
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 20, generator=generator), torch.randint(0, 3, (16,),
               generator=generator)) for _ in range(3)]
    trainer = Trainer(model, lambda p: torch.optim.SGD(p, lr=0.1),
                      nn.functional.cross_entropy, batches, torch.device("cpu"),
                      seed=int(sys.argv[1]))
    torch.manual_seed(os.getpid())  # whatever else the process draws
    for _ in range(3):
        trainer.gradient()
        trainer.optimizer_step()
    print(hashlib.sha256(trainer.flat.parameter.detach().numpy().tobytes()).hexdigest())
    """
)


@pytest.mark.slow
def test_a_seeded_trainer_takes_the_same_steps_in_two_fresh_processes() -> None:
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", STEPS, "5"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    digests = []
    for run in runs:
        stdout, stderr = run.communicate(timeout=60)
        assert run.returncode == 0, stderr
        digests.append(stdout.strip())
    assert len(digests[0]) == 64
    assert digests[0] == digests[1]


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 3))


def first_gradient(seed: int | None, global_seed: int) -> torch.Tensor:
    x, y = torch.ones(8, 20), torch.zeros(8, dtype=torch.long)
    trainer = Trainer(
        model(),
        lambda p: torch.optim.SGD(p, lr=0.1),
        nn.functional.cross_entropy,
        [(x, y)],
        torch.device("cpu"),
        seed=seed,
    )
    torch.manual_seed(global_seed)
    trainer.gradient()
    assert trainer.flat.parameter.grad is not None
    return trainer.flat.parameter.grad.clone()


def test_the_seed_decides_the_masks_and_without_one_the_global_generator_does() -> None:
    assert torch.equal(first_gradient(5, global_seed=1), first_gradient(5, global_seed=2))
    assert not torch.equal(first_gradient(5, global_seed=1), first_gradient(6, global_seed=1))
    assert torch.equal(first_gradient(None, global_seed=1), first_gradient(None, global_seed=1))
    assert not torch.equal(first_gradient(None, global_seed=1), first_gradient(None, global_seed=2))
