"""What a receiver refuses: :class:`PayloadError` and its kinds, one per check of ``decode``."""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["PAYLOAD_ERROR_KINDS", "PayloadError", "PayloadErrorKind"]

PayloadErrorKind = Literal[
    "codec", "field", "parameter", "dtype", "length", "index", "value", "non_finite"
]
PAYLOAD_ERROR_KINDS: tuple[PayloadErrorKind, ...] = get_args(PayloadErrorKind)
"""Every :attr:`PayloadError.kind`, in the order decode checks them:

``codec``: unknown codec, or not this decoder's; ``field``: not a map, a field missing or
extra, or of the wrong msgpack type; ``parameter``: a codec parameter carried in the payload
(qsgd ``bits``/``block``, sparse ``k``, chunked-topk ``chunk``/``k``/``bits``/``group``) out of range
or not this decoder's; ``dtype``: the ``dtype`` field is not the one the codec sends;
``length``: a byte field's length does not match d and the parameters; ``index``: sparse
indices outside [0, d) (chunked-topk: outside their chunk) or not strictly increasing (within
each chunk); ``value``: values outside their range (a negative qsgd scale, a level past 2L);
``non_finite``: NaN or infinity in a float field."""


class PayloadError(ValueError):
    """A payload refused by :meth:`Compressor.decode`: ``kind`` says which check failed.

    ``kind`` is one of :data:`PAYLOAD_ERROR_KINDS`, ``field`` the payload field at fault
    (``None`` when the payload as a whole is) and ``coordinate`` the vector's coordinate at
    fault where the codec knows it (a non-finite value in a dense ``data``). A ``ValueError``, so callers that only need
    "bad input" catch that; a receiver maps ``kind`` to its own typed errors (the peer to
    HTTP statuses) without parsing messages::

        >>> from gossip.compression import decode
        >>> try:
        ...     decode({"codec": "fp16", "dtype": "<f2", "data": b"\\x00"}, 4)
        ... except PayloadError as error:
        ...     print(error.kind, error.field)
        length data
    """

    def __init__(
        self,
        kind: PayloadErrorKind,
        message: str,
        *,
        field: str | None = None,
        coordinate: int | None = None,
    ) -> None:
        if kind not in PAYLOAD_ERROR_KINDS:
            raise ValueError(f"kind must be one of {PAYLOAD_ERROR_KINDS}, got {kind!r}")
        super().__init__(message)
        self.kind: PayloadErrorKind = kind
        self.field = field
        self.coordinate = coordinate
        """The coordinate of the decoded ``[d]`` vector at fault, where the field holds one
        value per coordinate (a dense codec's ``data``); ``None`` otherwise."""
