"""Error feedback around a lossy codec (Seide et al. 2014; Stich, Cordonnier & Jaggi 2018)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from gossip.compression.base import Compressed, Compressor, Payload, Randomness, check_input

__all__ = ["ErrorFeedback"]


class ErrorFeedback(Compressor):
    """Error feedback around a lossy codec: send ``C(x + e)``, keep ``e <- x + e - C(x + e)``.

    Seide et al. 2014 (1-bit SGD); Stich, Cordonnier & Jaggi 2018 (Sparsified SGD with
    memory). The residual ``e`` is sender-side state with the same leading batch as ``x``
    (``[n, d]`` in the simulator, ``[d]`` on a peer); the payload is the inner codec's, so
    receivers need not know. One instance keeps one residual: a sender whose messages differ
    per receiver keeps one instance per link and direction (``peer.codecs.LinkEncoders``).
    :meth:`reset` forgets the residual.
    """

    def __init__(self, inner: Compressor) -> None:
        super().__init__()
        if isinstance(inner, ErrorFeedback) or inner.lossless:
            raise ValueError(f"error feedback needs a lossy codec, got {inner.spec!r}")
        self.inner = inner
        self.codec = inner.codec  # type: ignore[misc]
        self._fields = inner._fields  # type: ignore[misc]
        self.residual: Tensor | None = None

    @property
    def spec(self) -> str:
        sep = "," if ":" in self.inner.spec else ":"
        return f"{self.inner.spec}{sep}feedback=true"

    def _corrected(self, x: Tensor) -> Tensor:
        if self.residual is None or self.residual.shape != x.shape:
            if self.residual is not None:
                raise ValueError(
                    f"error feedback residual has shape {tuple(self.residual.shape)} but x has "
                    f"{tuple(x.shape)}; call reset() before changing the batch"
                )
            return x
        return x + self.residual

    def compress(self, x: Tensor, generator: Randomness = None) -> Compressed:
        check_input(x, batched=True)
        corrected = self._corrected(x)
        out = self.inner.compress(corrected, generator)
        self.residual = corrected - out.values
        return out

    def encode_and_decode(self, x: Tensor, generator: Randomness = None) -> tuple[Payload, Tensor]:
        check_input(x, batched=False)
        corrected = self._corrected(x)
        payload, values = self.inner.encode_and_decode(corrected, generator)
        self.residual = corrected - values.to(x.dtype)
        return payload, values

    def decode(self, payload: Mapping[str, Any], d: int) -> Tensor:
        return self.inner.decode(payload, d)

    def wire_bytes(self, d: int, dtype: torch.dtype = torch.float32) -> int:
        return self.inner.wire_bytes(d, dtype)

    def reset(self) -> None:
        self.residual = None

    def _encode_fields(self, x: Tensor, generator: Randomness) -> dict[str, Tensor]:
        return self.inner._encode_fields(x, generator)

    def _decode_fields(self, fields: Mapping[str, Tensor], d: int) -> Tensor:
        return self.inner._decode_fields(fields, d)

    def _serialize(self, fields: Mapping[str, Tensor], d: int) -> Payload:
        return self.inner._serialize(fields, d)

    def _parse(self, payload: Mapping[str, Any], d: int) -> dict[str, Tensor]:
        return self.inner._parse(payload, d)
