"""Run one algorithm round by round: advance the simulated clock, count bytes, evaluate."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sim.algorithms import Algorithm, Context, RoundReport
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
) -> list[Record]:
    """Run ``rounds`` rounds of ``algorithm``; evaluate before the first round, every
    ``eval_every`` rounds and after the last. Returns the records in order."""
    if not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"rounds: must be an integer >= 0, got {rounds!r}")
    if not isinstance(eval_every, int) or eval_every < 1:
        raise ValueError(f"eval_every: must be an integer >= 1, got {eval_every!r}")
    algorithm.setup(ctx)
    counter = ByteCounter(ctx.n)
    steps = 0
    train_loss = float("nan")
    records = [_record(algorithm, ctx, evaluation, counter, steps, train_loss)]
    for index in range(rounds):
        report = algorithm.round(ctx)
        ctx.time += report.time
        ctx.round += 1
        counter.add(report)
        steps += report.steps
        train_loss = report.train_loss
        if ctx.round % eval_every == 0 or index == rounds - 1:
            records.append(_record(algorithm, ctx, evaluation, counter, steps, train_loss))
        if on_round is not None:
            on_round(ctx.round)
    return records


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
    return Record(
        algorithm=algorithm.name,
        round=ctx.round,
        time=ctx.time,
        steps=steps,
        bytes_total=counter.total,
        bytes_busiest=counter.busiest,
        train_loss=train_loss,
        group_metrics=evaluation.measure_groups(ctx.peers, models, ctx.honest),
        **measured,
    )
