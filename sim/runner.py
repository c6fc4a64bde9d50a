"""Run one algorithm round by round: advance the simulated clock, count bytes, evaluate.

A run whose honest models stop being finite ends at that round (:mod:`sim.divergence`): the
records evaluated before it are returned, each marked ``diverged_at``. A DP-SGD run (``[privacy]``,
:mod:`sim.privacy`) records ε in every record and ends, with a warning, before the round that
would take it past the target ε: every record is marked ``privacy_stopped_at``. A run with
``[audit]`` (:mod:`sim.audit`) attacks the models it ends with and puts the results in its last
record (:data:`sim.metrics.AUDIT_COLUMNS`); a run that diverged is not audited.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from torch import Tensor

from sim.algorithms import Algorithm, Context, RoundReport
from sim.divergence import Divergence, find_divergence
from sim.metrics import Evaluation, Record


class ByteCounter:
    """Bytes sent so far by each peer and by the servers (shared equally among shards)."""

    def __init__(self, n: int) -> None:
        self.peers = np.zeros(n)
        self.server = 0.0
        self.servers = 0

    def add(self, report: RoundReport) -> None:
        self.peers += report.bytes_sent
        self.server += report.server_bytes
        self.servers = max(self.servers, report.servers)

    @property
    def total(self) -> float:
        return float(self.peers.sum() + self.server)

    @property
    def busiest(self) -> float:
        per_server = self.server / self.servers if self.servers else 0.0
        return float(max(self.peers.max(initial=0.0), per_server))


def run(
    algorithm: Algorithm,
    ctx: Context,
    evaluation: Evaluation,
    *,
    rounds: int,
    eval_every: int = 10,
    on_round: Callable[[int], None] | None = None,
    on_diverge: Callable[[Divergence], None] | None = None,
) -> list[Record]:
    """Run ``rounds`` rounds of ``algorithm``; evaluate before the first round, every
    ``eval_every`` rounds and after the last. Returns the records in order.

    After every round the honest models are checked: the first round that leaves one of them
    non-finite (or fails because one became non-finite within it: a rule refuses a
    non-finite own vector) ends the run. The records evaluated before it are returned, each
    with ``diverged_at`` set to that round, and ``on_diverge`` is called with the
    :class:`~sim.divergence.Divergence` (which peers, which round).
    """
    if not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"rounds: must be an integer >= 0, got {rounds!r}")
    if not isinstance(eval_every, int) or eval_every < 1:
        raise ValueError(f"eval_every: must be an integer >= 1, got {eval_every!r}")
    algorithm.setup(ctx)
    counter = ByteCounter(ctx.n)
    steps = 0
    train_loss = float("nan")
    records = [_record(algorithm, ctx, evaluation, counter, steps, train_loss)]
    divergence: Divergence | None = None
    stopped: int | None = None
    for index in range(rounds):
        if ctx.privacy is not None and ctx.privacy.steps_left() < ctx.privacy.steps_per_round:
            stopped = ctx.round
            _warn_privacy_stop(ctx)
            if records[-1].round != ctx.round:
                records.append(_record(algorithm, ctx, evaluation, counter, steps, train_loss))
            break
        try:
            report = algorithm.round(ctx)
        except ValueError:
            # a rule refuses a non-finite own vector: the round itself made one (its local
            # step overflowed); any other error is the caller's to see
            divergence = _divergence(algorithm, ctx, ctx.round + 1)
            if divergence is None:
                raise
            break
        ctx.time += report.time
        ctx.round += 1
        counter.add(report)
        steps += report.steps
        train_loss = report.train_loss
        divergence = _divergence(algorithm, ctx, ctx.round)
        if divergence is not None:
            break
        if ctx.round % eval_every == 0 or index == rounds - 1:
            records.append(_record(algorithm, ctx, evaluation, counter, steps, train_loss))
        if on_round is not None:
            on_round(ctx.round)
    if stopped is not None:
        records = [dataclasses.replace(record, privacy_stopped_at=stopped) for record in records]
    if divergence is None:
        if ctx.audit is not None:  # the attacks on the models the run ends with
            columns: dict[str, Any] = ctx.audit.measure(algorithm, ctx).columns()
            records[-1] = dataclasses.replace(records[-1], **columns)
        return records
    if on_diverge is not None:
        on_diverge(divergence)
    return [dataclasses.replace(record, diverged_at=divergence.round) for record in records]


def _warn_privacy_stop(ctx: Context) -> None:
    privacy = ctx.privacy
    assert privacy is not None
    ledger = privacy.ledger
    warnings.warn(
        f"privacy: stopped before round {ctx.round + 1}: its {privacy.steps_per_round} step(s) "
        f"would take epsilon from {ledger.epsilon:.4g} past the budget {ledger.target:g} "
        f"(delta {ledger.delta:g}, sigma {ledger.noise_multiplier:.4g}, q {ledger.sample_rate:.4g})",
        UserWarning,
        stacklevel=3,
    )


def _divergence(algorithm: Algorithm, ctx: Context, round_: int) -> Divergence | None:
    """The divergence at ``round_`` if an honest model is non-finite now. A gossip runner's
    ``parameters`` (every peer's row of one ``[n, d]`` tensor, the rows ``models()`` copies
    the honest ones from) are checked in place, without that copy."""
    rows = getattr(algorithm, "parameters", None)
    if not (isinstance(rows, Tensor) and rows.dim() == 2 and rows.shape[0] == ctx.n):
        rows = algorithm.models(ctx)
    return find_divergence(round_, rows, ctx.honest)


def _record(
    algorithm: Algorithm,
    ctx: Context,
    evaluation: Evaluation,
    counter: ByteCounter,
    steps: int,
    train_loss: float,
) -> Record:
    models = algorithm.models(ctx)
    measured = evaluation.measure(ctx.peers, models)
    pair = _pair_columns(ctx)
    return Record(
        algorithm=algorithm.name,
        round=ctx.round,
        time=ctx.time,
        steps=steps,
        bytes_total=counter.total,
        bytes_busiest=counter.busiest,
        test_accuracy=measured["test_accuracy"],
        test_loss=measured["test_loss"],
        peer_accuracy_mean=measured["peer_accuracy_mean"],
        peer_accuracy_worst=measured["peer_accuracy_worst"],
        consensus_distance=measured["consensus_distance"],
        train_loss=train_loss,
        group_metrics=evaluation.measure_groups(ctx.peers, models, ctx.honest),
        test_bits_per_byte=measured.get("test_bits_per_byte"),
        peer_bits_per_byte_mean=measured.get("peer_bits_per_byte_mean"),
        peer_bits_per_byte_worst=measured.get("peer_bits_per_byte_worst"),
        epsilon=None if ctx.privacy is None else ctx.privacy.epsilon(),
        epsilon_pair=pair[0],
        epsilon_pair_muffliato=pair[1],
    )


def _pair_columns(ctx: Context) -> tuple[float | None, float | None]:
    """``epsilon_pair`` and ``epsilon_pair_muffliato`` of a run with ``[privacy] pair``."""
    privacy = ctx.privacy
    if privacy is None or privacy.pair is None:
        return (None, None)
    return privacy.pair.epsilons(ctx.round, privacy.epsilon())
