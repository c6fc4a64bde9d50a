"""Reading request bodies so that nothing is parsed before it is authenticated.

* A body signed by digest (JSON control bodies, digest-signed exchanges) is read whole
  (:func:`read_whole`: through its cap, charged to the unauthenticated byte budget as it
  arrives, under the body deadline), its SHA-256 checked against the signature, and only
  then parsed.
* A stream-signed body (``peer.protocol.signatures``: the header, verified before the body is read,
  signs its length; the body's last 16 bytes are the Poly1305 tag of the rest) is parsed as
  it streams, through a :class:`TaggedBody`, which MACs every byte before the tag as it is
  handed over and keeps the tag out of the parser's sight. Whatever the parser makes of
  the bytes (an object, or a malformation), :meth:`TaggedBody.verify` then reads the rest
  of the body (MACing what the parser left, dropping it) and checks the tag: a tag that
  does not verify is ``401 unauthorized`` whatever malformation preceded it, and only a
  body whose tag verifies is refused for its form (``400``). Nothing parsed from such a
  body is decoded, applied or answered before its tag verifies.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.streams import StreamReader as HttpStream
from cryptography.hazmat.primitives.poly1305 import Poly1305

from peer.protocol.errors import BodyTooLarge, MalformedBody, MalformedRequest, Unauthorized
from peer.protocol.signatures import TAG_BYTES
from peer.protocol.source import BodySource, Landed
from peer.transport.admission import ByteAccount

__all__ = ["TaggedBody", "check_identity", "read_whole"]


def check_identity(headers: Mapping[str, str]) -> None:
    """Refuse a body with a Content-Encoding other than ``identity`` before it is read
    (``400 malformed_request``): the protocol's bodies are sent as they are (a codec
    compresses an envelope's payload), and the server never decodes one."""
    encoding = headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise MalformedRequest(
            f"Content-Encoding {encoding[:32]!r} is not accepted; bodies are sent as they "
            "are (allowed: identity)"
        )


async def read_whole(
    stream: HttpStream, *, length: int | None, cap: int, account: ByteAccount | None
) -> bytes:
    """A body read whole through aiohttp's ``stream``: at most ``cap`` bytes, every chunk
    charged to ``account`` as it arrives (``None``: charged before, in full), so a large
    or slow body holds no more than it sent. Run it under the body deadline."""
    body = bytearray()
    try:
        while chunk := await stream.readany():
            if len(body) + len(chunk) > cap:
                raise BodyTooLarge(f"body exceeds the cap of {cap} bytes")
            if account is not None:
                account.charge(len(chunk))
            body += chunk
    except (ConnectionError, web.RequestPayloadError, HttpProcessingError) as error:
        raise MalformedBody(f"body broken off: {error}") from None
    if length is not None and len(body) != length:
        raise MalformedBody(f"body ended after {len(body)} of {length} bytes (Content-Length)")
    return bytes(body)


class TaggedBody:
    """A stream-signed body of ``length`` bytes as a :class:`~peer.protocol.source.BodySource`
    of its first ``length - 16`` (the tag withheld), MACed under ``key`` as they are handed
    over. :meth:`verify` reads what is left and checks the tag."""

    def __init__(self, source: BodySource, *, length: int, key: bytes) -> None:
        self._source = source
        self._mac = Poly1305(key)
        self.length = length
        self._left = max(0, length - TAG_BYTES)
        """Bytes before the tag not handed over yet."""
        self._tag = bytearray()

    @property
    def content_length(self) -> int:
        """The bytes a parser may read: the body without its tag."""
        return max(0, self.length - TAG_BYTES)

    def _take(self, chunk: bytes) -> bytes:
        part = chunk[: self._left]
        self._tag += chunk[len(part) :]
        if part:
            self._mac.update(part)
            self._left -= len(part)
        return part

    async def read(self) -> bytes:
        while self._left > 0:
            chunk = await self._source.read()
            if not chunk:
                return b""
            part = self._take(chunk)
            if part:
                return part
        return b""

    async def read_into(self, view: memoryview, landed: Landed) -> int:
        if self._left == 0:
            return 0
        mac = self._mac

        def macced(part: memoryview) -> None:
            mac.update(part)
            landed(part)

        filled = await self._source.read_into(view[: self._left], macced)
        self._left -= filled
        return filled

    async def verify(self) -> None:
        """Read the rest of the body (dropping what the parser did not take) and check its
        tag: :class:`~peer.protocol.errors.Unauthorized` if it does not verify,
        :class:`~peer.protocol.errors.MalformedBody` if the body ended before its length."""
        while self._left > 0 and await self.read():
            pass
        while len(self._tag) < TAG_BYTES + 1:
            chunk = await self._source.read()
            if not chunk:
                break
            self._tag += chunk
        received = self.content_length - self._left + len(self._tag)
        if self._left > 0 or len(self._tag) < TAG_BYTES:
            if self.length < TAG_BYTES:
                raise Unauthorized("stream-signed body has no tag")
            raise MalformedBody(
                f"body ended after {received} of {self.length} bytes (Content-Length)"
            )
        if len(self._tag) != TAG_BYTES or not hmac.compare_digest(
            self._mac.finalize(), bytes(self._tag)
        ):
            raise Unauthorized("body tag does not match (wrong swarm secret or altered body)")
