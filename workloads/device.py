"""Where tensors live: one parser of ``auto``/``cpu``/``cuda``/``cuda:I`` for both runners.

The simulator (``ExperimentConfig.device``) and a networked peer (``PeerConfig.device``,
``--device``) accept the same strings and fail the same way.
"""

from __future__ import annotations

import re

import torch

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:[0-9]+)?")
"""The accepted device strings (full match)."""
DEVICE_CHOICES = "auto, cpu, cuda or cuda:INDEX"


def resolve_device(spec: str) -> torch.device:
    """``auto`` (the GPU when there is one, else the CPU), ``cpu``, ``cuda`` or ``cuda:I``.

    Raises ``ValueError`` for a malformed spec, for ``cuda`` when
    ``torch.cuda.is_available()`` is False, and for a GPU index beyond the count.

        >>> resolve_device("cpu")
        device(type='cpu')
    """
    if not isinstance(spec, str) or DEVICE_PATTERN.fullmatch(spec) is None:
        raise ValueError(f"device must be {DEVICE_CHOICES}, got {spec!r}")
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(
            f"device {spec!r}: CUDA is not available on this machine (torch "
            f"{torch.__version__}); use cpu or auto"
        )
    device = torch.device(spec)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(
            f"device {spec!r}: index must be < {torch.cuda.device_count()} (GPUs on this machine)"
        )
    return device
