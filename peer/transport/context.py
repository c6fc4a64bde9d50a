"""What every endpoint of one app shares: the service, its limits and the pools that enforce
them, and the answers every endpoint gives the same way (a refusal, a signed JSON answer)."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from peer.protocol.errors import Busy, ProtocolError
from peer.protocol.signatures import sign_response
from peer.transport.admission import ByteBudget, ServerLimits, ServingShare, Slots
from peer.transport.body import ArenaPool
from peer.transport.responses import error_response
from peer.transport.service import DIRECT_READ, ServerState, Service, server_log
from peer.transport.shaping import EmulatedLink
from peer.transport.socket_reads import DirectReads

__all__ = ["ServerContext"]


@dataclass
class ServerContext:
    """One app's service, limits, exchange slots, unauthenticated byte budget, receive
    buffers, body reads and serving share (:meth:`of` makes them from the limits), and the
    peer's emulated uplink its answers go out on (``None``: not shaped)."""

    service: Service
    limits: ServerLimits
    slots: Slots
    budget: ByteBudget
    arenas: ArenaPool
    reads: DirectReads
    share: ServingShare | None = field(default=None)
    link: EmulatedLink | None = field(default=None)

    @classmethod
    def of(
        cls,
        service: Service,
        limits: ServerLimits,
        *,
        direct_reads: bool | None = None,
        link: EmulatedLink | None = None,
    ) -> ServerContext:
        """The context of one app; ``direct_reads``: :class:`DirectReads`' ``direct``."""
        return cls(
            service=service,
            limits=limits,
            slots=Slots(limits.max_concurrent_exchanges),
            budget=ByteBudget(limits.max_unauthenticated_bytes),
            arenas=ArenaPool(
                limits.max_concurrent_exchanges,
                pin=service.pin_buffers,
            ),
            reads=DirectReads(direct=direct_reads),
            share=service.serving_share,
            link=link,
        )

    @property
    def deadline_s(self) -> float:
        """The deadline of every request body and of every answer's writing."""
        return self.limits.body_timeout_s

    def state(self) -> ServerState:
        return ServerState(
            limits=self.limits,
            slots=self.slots,
            budget=self.budget,
            direct_reads=self.reads.enabled,
        )

    def refused(self, request: web.Request, error: ProtocolError) -> web.Response:
        """``error`` as the JSON answer, counted and logged as one line; the connection
        closes after it where a direct read left its parser out of step."""
        self.service.metrics.errors(code=error.code).inc()
        server_log.info("%s %s refused: %s", request.method, request.path, error.detail)
        response = error_response(error)
        if request.get(DIRECT_READ):
            response.force_close()
        return response

    def sign(self, response: web.Response, nonce: str | None) -> web.Response:
        """Count a whole answer's bytes, and sign it for the request's ``nonce`` (signed
        requests of a swarm with a secret)."""
        body_out = response.body
        if isinstance(body_out, bytes | bytearray):
            self.service.metrics.bytes(direction="out").inc(len(body_out))
            if self.service.secret is not None and nonce is not None:
                response.headers.update(
                    sign_response(self.service.secret, response.status, nonce, bytes(body_out))
                )
        return response

    def busy(self) -> Busy:
        """The refusal of an exchange beyond the slot bound."""
        slots = self.slots
        return Busy(f"{slots.in_use} exchanges in progress, the bound is {slots.size}; retry later")

    def share_busy(self) -> Busy:
        """The refusal of an exchange beyond the serving share (:class:`ServingShare`)."""
        assert self.share is not None
        return Busy(
            f"serving has taken {self.share.max_share:.0%} of this peer's time while it trains "
            "(the bound, max_serving_share); retry later"
        )

    def take_exchange_slot(self) -> None:
        """An exchange slot, if the serving share and the slot bound allow it (else
        ``409 busy``)."""
        if self.share is not None and not self.share.admit():
            raise self.share_busy()
        self.slots.take_now(self.busy())
