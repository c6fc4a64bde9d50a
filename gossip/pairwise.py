"""Pairwise gossip and AD-PSGD: one exchange between two nodes, written once for both runners.

AD-PSGD (Lian, Zhang, Zhang & Liu, ICML 2018, "Asynchronous decentralized parallel stochastic
gradient descent") builds on randomized pairwise gossip (Boyd, Ghosh, Prabhakar & Shah, IEEE
Trans. Inf. Theory 2006): a node i, the *caller*, picks one neighbour j, the *callee*, and the
two average, ``x_i, x_j <- (x_i + x_j) / 2``, while every other node keeps working. Each node
takes a gradient at its x, exchanges, then applies the gradient (combine-then-adapt, see
:func:`ad_psgd`).

One exchange, with ``C`` the compressor (``C(v)`` = what a receiver decodes from v's payload)
and ``A`` the consensus rule over two inputs with weight 1/2 (:func:`average_pair`):

1. caller: snapshot ``s = x_i`` and send ``C(s)``;
2. callee, atomically (under its model lock): ``a = A(x_j, C(s))``, adopt ``x_j <- a`` and
   answer ``C(a)`` (:meth:`PairwiseGossip.callee_answer`);
3. caller: ``x_i <- x_i + (C(a) - s)`` (:meth:`PairwiseGossip.caller_update`): it adopts the
   answer and keeps any progress ``p`` made on ``x_i`` during the round trip (with none, it
   takes ``C(a)`` exactly).

What the pair's sum does. With ``e_s = C(s) - s`` and ``e_a = C(a) - a`` the two codec errors
and ``A`` the mean, the pair ends at ``x_j = a`` and ``x_i = a + e_a + p``, so::

    x_i' + x_j' = x_i + x_j + p + e_s + e_a

* ``none`` (lossless): ``e_s = e_a = 0``, the sum is kept exactly (up to one float rounding of
  ``x_i + x_j``) under any interleaving of exchanges and local steps, and with ``p = 0`` both
  ends hold bitwise the same vector.
* ``fp16`` / ``bf16`` (round to nearest): the sum moves by two rounding errors,
  ``|e| <= 2^-11 |v|`` (fp16) or ``2^-8 |v|`` (bf16) per coordinate, and the two ends differ
  by ``e_a``; the errors are biased and can accumulate over exchanges.
* ``qsgd`` (stochastic rounding, Alistarh et al. 2017): ``E[e] = 0``, so the sum is kept in
  expectation, with ``|e_k| < s_b / L`` per coordinate (the block's scale over its levels).

A robust rule keeps the sum only where it returns the midpoint of two vectors: ``median`` of
two inputs is their mean; a clipping rule (``clipped-gossip``) pulls the callee less far and
both ends then hold (about) the callee's result.

Bytes: each exchange is two messages of :meth:`PairwiseGossip.message_bytes` each (the
caller's payload and the callee's answer; a dense codec's size depends only on d).

Runners: the simulator calls :meth:`PairwiseGossip.exchange` on a batch of disjoint pairs
``[m, 2]`` at once (callers in column 0, callees in column 1, codec on the batched path
``compress(x, generator).values``), or
:meth:`PairwiseGossip.exchange_rows` on the pairs' rows it has gathered itself; a peer calls
the two halves for itself around its wire codec (``peer.node.pairwise``).

>>> import torch
>>> rule = PairwiseGossip()
>>> x = torch.tensor([[1.0, 2.0], [3.0, 0.0], [9.0, 9.0]])
>>> rule.exchange(x, torch.tensor([[0, 1]]))
tensor([[2., 1.],
        [2., 1.],
        [9., 9.]])
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from consensus import Aggregator, WeightedMean
from gossip.algorithms import DecentralizedSGD, _aggregator, _compressor
from gossip.compression import Compressor, ErrorFeedback
from gossip.settings import ConfigurationError

__all__ = ["PairwiseGossip", "ad_psgd", "average_pair"]

_HALF = 0.5


def average_pair(own: Tensor, other: Tensor, aggregator: Aggregator | None = None) -> Tensor:
    """Randomized pairwise gossip (Boyd et al., IEEE Trans. Inf. Theory 2006):
    ``x_i, x_j <- (x_i + x_j) / 2``, or ``aggregator(own, [other], [1/2])`` for a robust rule.

    ``own [*, d]`` and ``other [*, d]``; returns a new ``[*, d]``. The rounding of
    ``x_i + x_j`` is the only one, so both peers adopting this one result keep the pair's sum.
    """
    if own.shape != other.shape:
        raise ValueError(f"own and other must have one shape, got {own.shape} and {other.shape}")
    weights = own.new_full((*own.shape[:-1], 1), _HALF)
    return _aggregator(aggregator)(own, other.unsqueeze(-2), weights)


class PairwiseGossip:
    """The two halves of one pairwise (AD-PSGD) exchange and their batched driver.

    See the module docstring for the protocol and what it keeps of the pair's sum.

    Args:
        aggregator: the consensus rule the callee mixes its model and the caller's with, called
            with two inputs and weight 1/2; default ``consensus`` ``mean``.
        compressor: the dense codec both messages travel in (``none``, ``fp16``, ``bf16``,
            ``qsgd``); default ``none``. The per-node halves do not transport (a peer encodes
            with its own codec objects); :meth:`exchange` and :meth:`message_bytes` use it.

    >>> import consensus, gossip, torch
    >>> rule = PairwiseGossip(consensus.build("median"), gossip.build_compressor("fp16"))
    >>> rule.message_bytes(1000) < gossip.build_compressor("none").wire_bytes(1000)
    True
    """

    def __init__(
        self, aggregator: Aggregator | None = None, compressor: Compressor | None = None
    ) -> None:
        self.aggregator = _aggregator(aggregator)
        self.compressor = _compressor(compressor)

    @classmethod
    def of(cls, algorithm: DecentralizedSGD) -> PairwiseGossip:
        """The exchange of a built AD-PSGD algorithm (``gossip.build_algorithm`` with
        ``ad-psgd``): its ``aggregator`` and ``compressor``."""
        return cls(algorithm.aggregator, algorithm.compressor)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(aggregator={self.aggregator!r}, "
            f"compressor={self.compressor.spec!r})"
        )

    # ------------------------------------------------------------------ the two halves

    def callee_answer(self, own: Tensor, received: Tensor) -> Tensor:
        """The passive node's atomic update: ``x_j <- average_pair(x_j, C(s), aggregator)``.

        Args:
            own: ``[*, d]`` the callee's model, overwritten in place with the average (call it
                under the model's lock).
            received: ``[*, d]`` the caller's decoded message ``C(s)``.
        Returns the average as a separate tensor (not a view of ``own``): the answer to encode
        and send back, which training may not touch.
        """
        with torch.no_grad():
            received = received.to(device=own.device, dtype=own.dtype)
            averaged = average_pair(own, received, self.aggregator)
            own.copy_(averaged)
        return averaged

    @property
    def answers_by_chunk(self) -> bool:
        """Whether :meth:`callee_answer_by_chunk` may run: the rule is the plain mean, which
        is elementwise (a chunk of the average is the average of the chunks)."""
        return type(self.aggregator) is WeightedMean

    def callee_answer_by_chunk(
        self,
        own: Tensor,
        received: Tensor,
        out: Tensor,
        *,
        chunk: int,
        computed: Callable[[int], None] | None = None,
    ) -> Tensor:
        """:meth:`callee_answer` for the plain mean, ``chunk`` elements at a time: the average
        of each chunk of ``own [d]`` and ``received [d]`` is written into ``out [d]`` and
        ``computed(end)`` is called (a runner sends what is ready), then ``own <- out`` once
        every chunk is computed (a failure, such as a non-finite ``own``, leaves ``own``
        untouched). Equal to :meth:`callee_answer` element for element. Call it under the
        model's lock. Returns ``out``."""
        rule = self.aggregator
        if not (self.answers_by_chunk and isinstance(rule, WeightedMean)):
            raise ValueError(f"only the mean averages by chunk, not {rule!r}")
        _check_chunks(chunk, own=own, received=received, out=out)
        numel = own.numel()
        with torch.no_grad():
            received = received.to(device=own.device, dtype=own.dtype)
            half = own.new_full((1,), _HALF)
            for start in range(0, numel, chunk):
                end = min(numel, start + chunk)
                rule(own[start:end], received[start:end].unsqueeze(0), half, out=out[start:end])
                if computed is not None:
                    computed(end)
            own.copy_(out)
        return out

    @staticmethod
    def caller_update(own: Tensor, sent: Tensor, answer: Tensor) -> Tensor:
        """The active node's update: ``x_i <- x_i + (C(a) - s)``, in place.

        Args:
            own: ``[*, d]`` the caller's model now (call it under the model's lock).
            sent: ``[*, d]`` the snapshot ``s`` it encoded and sent, exact (not ``C(s)``).
            answer: ``[*, d]`` the callee's decoded answer ``C(a)``.
        Rows of ``own`` still equal to ``sent`` (no progress during the round trip) take
        ``answer`` exactly; other rows keep the progress ``x_i - s``. Returns ``own``.
        ``sent`` may be ``own`` itself (a runner whose caller cannot progress meanwhile):
        then every row without a NaN takes ``answer``, as with a separate snapshot.
        """
        if own.shape != sent.shape or own.shape != answer.shape:
            raise ValueError(
                f"own, sent and answer must have one shape, got {tuple(own.shape)}, "
                f"{tuple(sent.shape)} and {tuple(answer.shape)}"
            )
        with torch.no_grad():
            if sent is own:
                # a finite row sum proves the row finite, so equal to itself: one cheap pass
                # instead of an elementwise comparison; otherwise compare with a snapshot
                if bool(torch.isfinite(own.sum(dim=-1)).all()):
                    return own.copy_(answer.to(device=own.device, dtype=own.dtype))
                sent = own.clone()
            sent = sent.to(device=own.device, dtype=own.dtype)
            answer = answer.to(device=own.device, dtype=own.dtype)
            if own.dim() == 1:
                if torch.equal(own, sent):
                    return own.copy_(answer)
                return own.add_(answer).sub_(sent)
            unchanged = (own == sent).all(dim=-1)
            if bool(unchanged.all()):
                return own.copy_(answer)
            own.add_(answer).sub_(sent)
            own[unchanged] = answer[unchanged]
        return own

    # ------------------------------------------------------------------ batched driver

    def exchange(
        self, x: Tensor, pairs: Tensor, generator: torch.Generator | None = None
    ) -> Tensor:
        """Run one exchange for each pair of a matching at once, in place.

        ``x[a], x[b]`` for each row ``(a, b)`` of ``pairs``: caller ``a`` sends ``C(x[a])``,
        callee ``b`` adopts ``A(x[b], C(x[a]))`` and answers it compressed, caller ``a`` adopts
        the answer. Both messages take the batched codec path
        (``compressor.compress(v, generator).values``, callers' payloads first, then the
        answers); each costs :meth:`message_bytes` bytes.

        Args:
            x: ``[n, d]`` all nodes.
            pairs: ``[m, 2]`` int node indices, callers in column 0; every node in at most one
                pair.
            generator: randomness of stochastic codecs (``qsgd``).
        Returns ``x``.
        """
        if x.dim() != 2:
            raise ValueError(f"x must have shape [n, d], got {tuple(x.shape)}")
        if pairs.dim() != 2 or pairs.shape[-1] != 2 or pairs.is_floating_point():
            raise ValueError(
                f"pairs must be an int tensor of shape [m, 2], got {tuple(pairs.shape)}"
            )
        self.check_batchable()
        pairs = pairs.to(device=x.device, dtype=torch.int64)
        if pairs.numel() == 0:
            return x
        flat = pairs.reshape(-1)
        if int(flat.min()) < 0 or int(flat.max()) >= x.shape[0]:
            raise ValueError(f"pairs must index nodes in [0, {x.shape[0]})")
        if flat.unique().numel() != flat.numel():
            raise ValueError("pairs must be disjoint (a matching): a node appears twice")
        callers, callees = pairs[:, 0], pairs[:, 1]
        with torch.no_grad():
            # index_select / index_copy_: several times faster than advanced indexing on CPU
            sent = torch.index_select(x, 0, callers)
            own = torch.index_select(x, 0, callees)
            self.exchange_rows(sent, own, generator)
            x.index_copy_(0, callees, own)
            x.index_copy_(0, callers, sent)
        return x

    def exchange_rows(
        self, callers: Tensor, callees: Tensor, generator: torch.Generator | None = None
    ) -> None:
        """One exchange per row, in place: caller i holds ``callers[i]``, its callee
        ``callees[i]`` (``[m, d]`` each, e.g. two row blocks of one buffer; no row in both).

        The rule of :meth:`exchange` on rows a runner has already gathered: caller i sends
        ``C(s)`` with ``s = callers[i]``; the callee adopts ``a = A(callees[i], C(s))``
        (:meth:`callee_answer`) and answers ``C(a)``; the caller, which made no progress
        during the round trip (its row is still ``s``), updates by :meth:`caller_update`,
        i.e. takes ``C(a)``. Codec draws: callers' payloads first, then the answers.
        """
        if callers.dim() != 2 or callers.shape != callees.shape:
            raise ValueError(
                "callers and callees must be [m, d] tensors of one shape, got "
                f"{tuple(callers.shape)} and {tuple(callees.shape)}"
            )
        self.check_batchable()
        if callers.shape[0] == 0:
            return
        with torch.no_grad():
            received = self.compressor.compress(callers, generator).values
            averaged = self.callee_answer(callees, received)
            answer = self.compressor.compress(averaged, generator).values
            self.caller_update(callers, callers, answer)  # its rows are the snapshot

    def message_bytes(self, d: int) -> int:
        """Bytes of one message, ``compressor.wire_bytes(d)``: an exchange sends two, the
        caller's payload and the callee's answer (a runner charges one to each side)."""
        return self.compressor.wire_bytes(d)

    def check_batchable(self) -> None:
        """Refuse state that :meth:`exchange` cannot keep per node across changing pairs.

        Raises :class:`~gossip.settings.ConfigurationError` (a ``ValueError``) whose
        ``field`` is ``compressor`` for error feedback (its residual is per sender row) and
        ``aggregator`` for a stateful rule (``centered-clipping``'s centre,
        ``bucketing``'s shuffling): a batch's rows are different nodes from call to call.
        """
        if isinstance(self.compressor, ErrorFeedback):
            raise ConfigurationError(
                "compressor",
                f"{self.compressor.spec!r} keeps an error-feedback residual per "
                "sender, which a batch of changing pairs cannot hold; use none, fp16, bf16 or "
                "qsgd without feedback",
            )
        if getattr(self.aggregator, "stateful", False) is True:
            raise ConfigurationError(
                "aggregator",
                f"{self.aggregator!r} keeps state between calls, which a batch of "
                "changing pairs cannot hold per node; use a stateless rule (mean, median, "
                "clipped-gossip, ...)",
            )


def _check_chunks(chunk: int, **vectors: Tensor) -> None:
    """The chunked halves' arguments: one-dimensional vectors of one shape, ``chunk >= 1``."""
    shapes = [tuple(v.shape) for v in vectors.values()]
    if len(shapes[0]) != 1 or any(shape != shapes[0] for shape in shapes):
        raise ValueError(
            f"{', '.join(vectors)} must be one [d] shape, got {', '.join(map(str, shapes))}"
        )
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")


def ad_psgd(**kwargs: object) -> DecentralizedSGD:
    """AD-PSGD (Lian et al., ICML 2018): gradient at x_i, average with one random neighbour
    atomically (``x_i, x_j <- (x_i + x_j) / 2``), then apply the gradient: CTA over a matching.

    Keyword arguments go to :class:`~gossip.algorithms.DecentralizedSGD` (``aggregator``,
    ``compressor``). Drive it with matchings (``topologies.RandomMatching`` tables, ``k = 1``,
    weight 1/2) or with :meth:`PairwiseGossip.of` (``exchange`` in the simulator, the two
    halves on a peer).
    """
    return DecentralizedSGD(order="combine-then-adapt", **kwargs)  # type: ignore[arg-type]
