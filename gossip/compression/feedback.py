"""Error feedback around a lossy codec (Seide et al. 2014; Stich, Cordonnier & Jaggi 2018)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from torch import Tensor

from gossip.compression.base import Compressed, Compressor, Payload, Randomness, check_input

__all__ = ["ErrorFeedback"]

_T = TypeVar("_T")


class ErrorFeedback(Compressor):
    """Error feedback around a lossy codec: send ``C(x + e)``, keep ``e <- x + e - C(x + e)``.

    Seide et al. 2014 (1-bit SGD); Stich, Cordonnier & Jaggi 2018 (Sparsified SGD with
    memory). The residual ``e`` is sender-side state with the same leading batch as ``x``
    (``[n, d]`` in the simulator, ``[d]`` on a peer); the payload is the inner codec's, so
    receivers need not know. One instance keeps one residual: a sender whose messages differ
    per receiver would keep one instance per link and direction.
    :meth:`reset` forgets the residual.

    The residual lives in one ``[*, d]`` buffer, reused: ``x + e`` is formed in it, the inner
    codec encodes it, and ``e <- (x + e) - C(x + e)`` is written back in place, so a message
    costs no temporary of the model's size beyond what receivers decode. This relies on a
    lossy codec's payload never viewing its input (every codec here copies or converts).
    Should the inner codec raise mid-message, the residual is forgotten (as by
    :meth:`reset`): it no longer holds ``e``.
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
        """``x + e``: formed in the residual's own buffer, or ``x`` itself before the first
        message (a new tensor only if ``x``'s dtype changed)."""
        if self.residual is None:
            return x
        if self.residual.shape != x.shape:
            raise ValueError(
                f"error feedback residual has shape {tuple(self.residual.shape)} but x has "
                f"{tuple(x.shape)}; call reset() before changing the batch"
            )
        if self.residual.dtype != x.dtype:
            return x + self.residual
        return self.residual.add_(x)  # e + x == x + e exactly (IEEE addition commutes)

    def _keep(self, corrected: Tensor, sent: Tensor) -> None:
        """``e <- corrected - sent``, in place when ``corrected`` is the residual's buffer."""
        if corrected is self.residual:
            corrected.sub_(sent)
        else:
            self.residual = corrected - sent

    def _send(self, x: Tensor, inner: Callable[[Tensor], _T]) -> tuple[Tensor, _T]:
        """``inner(x + e)``; on failure the half-updated residual is dropped."""
        corrected = self._corrected(x)
        try:
            return corrected, inner(corrected)
        except BaseException:
            if corrected is self.residual:
                self.residual = None
            raise

    def compress(self, x: Tensor, generator: Randomness = None) -> Compressed:
        check_input(x, batched=True)
        corrected, out = self._send(x, lambda c: self.inner.compress(c, generator))
        self._keep(corrected, out.values)
        return out

    def encode(self, x: Tensor, generator: Randomness = None) -> Payload:
        """The inner codec's payload of ``x + e``; updates ``e`` (so it decodes, once)."""
        return self.encode_and_decode(x, generator)[0]

    def encode_and_decode(self, x: Tensor, generator: Randomness = None) -> tuple[Payload, Tensor]:
        check_input(x, batched=False)
        corrected, (payload, values) = self._send(
            x, lambda c: self.inner.encode_and_decode(c, generator)
        )
        self._keep(corrected, values.to(x.dtype))
        return payload, values

    def decode(self, payload: Mapping[str, Any], d: int) -> Tensor:
        return self.inner.decode(payload, d)

    def wire_bytes(self, d: int, dtype: torch.dtype = torch.float32) -> int:
        return self.inner.wire_bytes(d, dtype)

    def reset(self) -> None:
        self.residual = None

    def _encode_fields(self, x: Tensor, generator: Randomness) -> dict[str, Tensor]:
        return self.inner._encode_fields(x, generator)

    def _empty_fields(self, d: int, dtype: torch.dtype) -> dict[str, Tensor]:
        return self.inner._empty_fields(d, dtype)

    def _decode_fields(self, fields: Mapping[str, Tensor], d: int) -> Tensor:
        return self.inner._decode_fields(fields, d)

    def _serialize(self, fields: Mapping[str, Tensor], d: int) -> Payload:
        return self.inner._serialize(fields, d)

    def _parse(self, payload: Mapping[str, Any], d: int) -> dict[str, Tensor]:
        return self.inner._parse(payload, d)
