"""One ``gossipnet peer`` run from its parsed flags: build the peer, train, report.

:func:`build_peer` turns the workload flags into a :class:`~peer.node.peer.Peer` (data set,
this peer's shard of the partition, model, local optimizer, endless batches).
:func:`run_peer` is the process's life: start, print ``peer ID listening on ADDRESS``
(and ``--address-file``), wait for ``--wait-for-peers``, train in chunks of
``--status-every`` steps until ``--steps`` more steps (counted from the resumed step
after ``--resume``) or SIGTERM/SIGINT, report progress (a live rich line on stderr, or
a JSON status line on stdout per chunk), ``--hold``, stop (final checkpoint), then
evaluate for ``--eval-out``, write ``--save-model`` (also after a signal) and print a
final JSON status line; on the way out, a status line with ``"phase"`` (``stopping``,
``evaluating``, ``saving``) before each of those steps, so a supervisor knows the peer is
still finishing. ``--log-dir`` records a row (``metrics.csv`` and TensorBoard,
:mod:`peer.node.logbook`) per chunk and a last one with the test metrics of the data set's
task (:mod:`workloads.task`). Before anything starts, one forward pass of one batch checks
the model against the data (:func:`check_fit`). A join that no ``--join`` address answered within
``--join-timeout-s`` is one error line and exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from peer.app.logs import above_live
from peer.app.peer_flags import check_optimizer_flags, privacy_config
from peer.app.status import human_bytes
from peer.node.config import PeerConfig, resolve_device
from peer.node.logbook import Logbook
from peer.node.membership import Status
from peer.node.model_file import save_model, sidecar_path
from peer.node.peer import JoinError, Peer
from peer.node.privacy import PrivateTraining
from peer.node.recipe import ModelRecipe
from workloads import Dataset, build_model, load_dataset, partition, peer_batches
from workloads.accountant import noise_multiplier_for
from workloads.privacy import poisson_batches, sample_rates
from workloads.task import TASKS, ModelMismatchError, check_model_fits


def build_peer(args: argparse.Namespace, config: PeerConfig) -> tuple[Peer, Dataset]:
    """The peer the flags describe, and the data set it trains on (its test split is
    what ``--eval-out`` measures). Raises ``ValueError`` naming the flag on bad input."""
    torch.set_num_threads(1)
    _check_save_model(getattr(args, "save_model", None), getattr(args, "eval_out", None))
    data = load_dataset(args.dataset)
    shards = partition(args.partition, data.y_train, num_peers=args.num_peers, seed=args.seed)
    model = build_model(args.model, data.input_shape, data.num_classes, seed=args.seed)
    check_fit(model, data, args.model, args.dataset)
    optimizer = check_optimizer_flags(args).torch_optimizer
    # DP-SGD's noise and Poisson draws: keyed by a secret from the OS unless --dp-seeded
    noise_key = args.seed if getattr(args, "dp_seeded", False) else secrets.randbits(62)
    privacy = _privacy(args, [len(shard) for shard in shards], noise_key)
    batches = (
        peer_batches(
            data,
            shards[args.peer_index],
            batch_size=args.batch_size,
            seed=args.seed,
            peer=args.peer_index,
        )
        if privacy is None or privacy.config.sampling == "fixed"
        else poisson_batches(
            data, shards[args.peer_index], args.batch_size, seed=noise_key, peer=args.peer_index
        )
    )
    try:  # checked when a peer is built; named by flag here
        resolve_device(config.device)
    except ValueError as error:
        raise ValueError(f"--device: {error}") from None
    recipe = ModelRecipe(
        model=args.model,
        input_shape=data.input_shape,
        num_classes=data.num_classes,
        dataset=args.dataset,
        seed=args.seed,
    )
    peer = Peer(
        model, optimizer, TASKS[data.task].loss, batches, config, recipe=recipe, privacy=privacy
    )
    return peer, data


def check_fit(model: torch.nn.Module, data: Dataset, model_spec: str, dataset_spec: str) -> None:
    """One forward pass of one batch (:func:`workloads.task.check_model_fits`) before
    anything starts; a mismatch is a ``ValueError`` in one line naming ``--model`` and
    ``--dataset`` and what does not fit."""
    try:
        check_model_fits(model, data)
    except ModelMismatchError as error:
        raise ValueError(
            f"--model {model_spec} does not fit --dataset {dataset_spec}: {error}"
        ) from None


def _privacy(args: argparse.Namespace, sizes: list[int], key: int) -> PrivateTraining | None:
    """DP-SGD as the ``--dp-*`` flags say (None without them). σ is ``--dp-noise``, or the
    one that reaches ``--dp-epsilon`` in ``--steps`` at the largest sampling rate of any
    shard (the simulator's choice too, so both runners of one run use one σ). ``key`` keys
    the noise: a secret, or ``--seed`` with ``--dp-seeded``."""
    config = privacy_config(args)
    if config is None:
        return None
    rates = sample_rates(sizes, args.batch_size)
    noise = config.noise
    if noise is None:
        assert config.epsilon is not None  # PrivacyConfig: one of the two
        # the run's steps: a resumed peer's account holds its steps before the checkpoint
        # too, so σ covers those and --steps more (launch --resume and --crashes pass what
        # is left), the σ its first life picked
        steps = args.steps + (_resumed_step(args) if args.steps else 0)
        noise = noise_multiplier_for(
            config.epsilon, config.delta, float(rates.max()), steps, config.accountant
        )
    return PrivateTraining(
        config,
        noise_multiplier=noise,
        sample_rate=float(rates[args.peer_index]),
        batch_size=args.batch_size,
        seed=key,
        peer=args.peer_index,
        max_steps=args.steps or None,
    )


def _resumed_step(args: argparse.Namespace) -> int:
    """The step ``--resume`` will start from: that of the newest checkpoint that verifies in
    ``--checkpoint-dir`` (0 without ``--resume`` or a checkpoint), as the peer will load it."""
    if not getattr(args, "resume", False) or not getattr(args, "checkpoint_dir", None):
        return 0
    from peer.node.checkpoint import CheckpointError, load_latest

    try:
        checkpoint = load_latest(args.checkpoint_dir)
    except CheckpointError:
        return 0
    return 0 if checkpoint is None else checkpoint.step


def _check_save_model(path: str | None, eval_out: str | None = None) -> None:
    """``--save-model FILE`` must be writable where it is named, and its description
    (FILE with suffix ``.json``) must not be ``--eval-out``; checked before training."""
    if path is None:
        return
    target = Path(path)
    if eval_out is not None and Path(eval_out).resolve() == target.with_suffix(".json").resolve():
        raise ValueError(
            f"--eval-out: {eval_out} is where --save-model {path} writes its description; "
            "pick another file"
        )
    if target.suffix == ".json":
        raise ValueError(
            f"--save-model: FILE must not end in .json (FILE.json is its description), got {path}"
        )
    if not target.parent.is_dir():
        raise ValueError(f"--save-model: folder {target.parent} does not exist (for {path})")


async def run_peer(peer: Peer, data: Dataset, args: argparse.Namespace) -> int:
    """Run ``peer`` as the flags say until done or signalled; returns the exit code: 0, or
    2 when no ``--join`` address answered (one line on stderr naming it). With
    ``--log-dir`` (``PeerConfig.log_dir``) a :class:`~peer.node.logbook.Logbook` records a row
    per chunk of ``--status-every`` steps (the cadence of the status lines, live or not)
    and a last one after the stop, with the task's test metrics when ``--eval-out`` evaluated."""
    logbook = None
    if peer.config.log_dir is not None:  # opened before the peer starts: a problem stops here
        logbook = await asyncio.to_thread(Logbook.open, peer.config.log_dir, run_name=peer.peer_id)
    try:
        return await _run(peer, data, args, logbook)
    finally:
        if logbook is not None:
            await asyncio.to_thread(logbook.close)


async def _run(peer: Peer, data: Dataset, args: argparse.Namespace, logbook: Logbook | None) -> int:
    """:func:`run_peer`'s body: start, train in chunks, hold, stop, evaluate, save."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    live = args.progress == "live" or (args.progress == "auto" and sys.stderr.isatty())
    start_at = getattr(args, "start_at", None)
    if start_at is not None:  # launch --crashes: back at the rejoin time, start-up done
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, start_at - time.time()))
        if stop.is_set():
            return 0
    curve = _EvalLog(peer, data, args)
    if not args.resume:
        await curve.maybe_evaluate()  # the initial model, before any neighbour averages it
    try:
        await peer.start()
    except JoinError as error:
        print(f"gossipnet peer: error: {join_failure(error, peer.config.join)}", file=sys.stderr)
        return 2
    rate = _Rate(peer)
    progress = asyncio.ensure_future(_live_line(peer, rate, stop)) if live else None
    try:
        where = peer.address or "(client-only)"
        print(f"peer {peer.peer_id} listening on {where}", flush=True)
        if peer.resumed_from is not None:
            more = (
                f"; --steps {args.steps} counts from here: stopping at step "
                f"{peer.step + args.steps}"
                if args.steps
                else ""
            )
            print(f"resumed from {peer.resumed_from} at step {peer.step}{more}", flush=True)
        if args.address_file and peer.address:
            _write_atomically(args.address_file, peer.address)
        stopping = asyncio.ensure_future(stop.wait())
        if args.wait_for_peers:
            waiting = asyncio.ensure_future(peer.wait_for_members(args.wait_for_peers))
            await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
        target = peer.step + args.steps if args.steps else None
        await curve.begin()
        await curve.maybe_evaluate()  # a resumed peer's first
        while not stop.is_set() and (target is None or peer.step < target):
            if peer.privacy is not None and peer.privacy.stopped:
                break  # the privacy budget is spent (the peer warned)
            chunk = (
                args.status_every if target is None else min(args.status_every, target - peer.step)
            )
            chunk = curve.bound(chunk)
            training = asyncio.ensure_future(peer.run(steps=chunk))
            await asyncio.wait({training, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                training.cancel()
                await asyncio.gather(training, return_exceptions=True)
                break
            training.result()
            await curve.maybe_evaluate()
            if not live:
                print(json.dumps(_status_line(peer, rate)), flush=True)
            await _record(logbook, peer)
        if args.hold and not stop.is_set():
            print(json.dumps({**_status_line(peer, rate), "holding": True}), flush=True)
            await stopping
        stopping.cancel()
    finally:
        if progress is not None:
            progress.cancel()
            await asyncio.gather(progress, return_exceptions=True)
        _phase(peer, rate, "stopping", live)
        await peer.stop()
    final: dict[str, object] = {**_status_line(peer, rate), "stopped": True}
    evaluation = None
    if args.eval_out:
        _phase(peer, rate, "evaluating", live)
        evaluation = await _write_evaluation(peer, data, args)
        final.update({key: evaluation[key] for key in _scores(evaluation) if key != "test_loss"})
    await _record(logbook, peer, evaluation)
    model_file = getattr(args, "save_model", None)
    if model_file:
        _phase(peer, rate, "saving", live)
        final["model"] = str(await asyncio.to_thread(_save_model, peer, model_file, evaluation))
    print(json.dumps(final), flush=True)
    return 0


class _EvalLog:
    """``--eval-every N --eval-log FILE``: the test metrics at step 0 and every N steps, one
    JSON line each, timed on the peer's clock. Step 0 is evaluated before the peer starts (the
    initial model, before any neighbour can average with it), unless it resumes. ``began`` is
    the wall clock (``time.time()``) when training began (:meth:`begin`), the same on every
    line; ``train_s`` the seconds since then less the evaluations' own time (``eval_s``, in
    total so far), so the curve is of training as the simulator charges it, which does not
    evaluate on the clock; ``compute_s`` and ``slowdown_waited_s`` the local steps' own
    compute so far and a straggler's wait on top of it (``GET /v1/status``'s)."""

    def __init__(self, peer: Peer, data: Dataset, args: argparse.Namespace) -> None:
        self.peer, self.data = peer, data
        self.every = int(getattr(args, "eval_every", 0) or 0)
        self.path: str | None = getattr(args, "eval_log", None)
        self.start: float | None = None
        self.began = 0.0
        self.spent = 0.0
        self.last: int | None = None
        self.pending: dict[str, Any] | None = None

    def bound(self, chunk: int) -> int:
        """``chunk`` steps, or fewer so that a chunk ends at the next evaluation's step."""
        if not self.every:
            return chunk
        return max(1, min(chunk, self.every - self.peer.step % self.every))

    async def begin(self) -> None:
        """Training begins now: the clock starts, and a step-0 evaluation made before is
        written."""
        self.start, self.began = time.perf_counter(), time.time()
        if self.pending is not None:
            await self._write({**self.pending, "began": self.began, "train_s": 0.0})
            self.pending = None

    async def maybe_evaluate(self) -> None:
        """Evaluate if this step is one of every N (once per step)."""
        step = self.peer.step
        if not self.every or self.path is None or step % self.every or step == self.last:
            return
        began = time.perf_counter()
        scores = await asyncio.to_thread(
            self.peer.trainer.evaluate_task, self.data.x_test, self.data.y_test, self.data.task
        )
        self.last = step
        line = {
            "id": self.peer.peer_id,
            "step": step,
            "round": self.peer.round,
            **{f"test_{name}": value for name, value in scores.items()},
        }
        if self.start is None:  # before training: written when it begins
            self.pending = line
            return
        line["train_s"] = began - self.start - self.spent
        status = self.peer.status()  # its local steps' own compute, and a straggler's wait
        line["compute_s"] = status.get("compute_s")
        line["slowdown_waited_s"] = status.get("slowdown_waited_s")
        self.spent += time.perf_counter() - began
        await self._write({**line, "began": self.began})

    async def _write(self, line: dict[str, Any]) -> None:
        assert self.path is not None
        text = json.dumps({**line, "eval_s": self.spent}) + "\n"
        await asyncio.to_thread(_append, self.path, text)


def _append(path: str, text: str) -> None:
    with open(path, "a", encoding="utf-8") as stream:
        stream.write(text)


def _phase(peer: Peer, rate: _Rate, phase: str, live: bool) -> None:
    """A status line saying what the peer is doing on its way out: ``stopping`` (final
    checkpoint, connections closed), ``evaluating`` (``--eval-out``), ``saving``
    (``--save-model``); ``launch`` waits longer for a peer that is still at it
    (:meth:`peer.app.swarm.Swarm.stop`). Not on a live line: it is for supervisors."""
    if not live:
        print(json.dumps({**_status_line(peer, rate), "phase": phase}), flush=True)


async def _record(
    logbook: Logbook | None, peer: Peer, evaluation: dict[str, Any] | None = None
) -> None:
    """One ``--log-dir`` row from the peer's status, written off the event loop; with an
    ``evaluation`` (``--eval-out``) also the task's test metrics under their names
    (``accuracy``, ``bits_per_byte``, ``mse``: :data:`workloads.task.METRIC_NAMES`, each a
    column, blank where the task has none) and the test loss (TensorBoard's ``test_loss``); with DP-SGD also ε (TensorBoard's ``epsilon``)."""
    if logbook is None:
        return
    status = peer.status()
    # DP-SGD's epsilon so far: TensorBoard and MLflow (docs/privacy.md)
    spent = {} if status["privacy"] is None else {"epsilon": status["privacy"]["epsilon"]}
    if evaluation is None:
        await asyncio.to_thread(lambda: logbook.record_status(status, **spent))
        return
    scores = {key.removeprefix("test_"): evaluation[key] for key in _scores(evaluation)}
    scores["test_loss"] = scores.pop("loss")
    scores.update(spent)
    await asyncio.to_thread(lambda: logbook.record_status(status, **scores))


def _scores(evaluation: dict[str, Any]) -> list[str]:
    """The keys of an ``--eval-out`` report that hold the task's test metrics
    (``test_accuracy``, ``test_loss``, ``test_bits_per_byte``, ``test_mse``)."""
    return [f"test_{name}" for name in TASKS[evaluation["task"]].metric_names] + (
        [] if TASKS[evaluation["task"]].has_accuracy else ["test_accuracy"]
    )


def join_failure(error: JoinError, join: Sequence[str]) -> str:
    """One line for a join that failed: the ``--join`` addresses (and how many members the
    resumed checkpoint remembered), what to do, and each address's last error."""
    flags = [a for a in error.addresses if a in join]
    remembered = len(error.addresses) - len(flags)
    also = f" (and {remembered} members remembered by the checkpoint)" if remembered else ""
    hint = (
        f"no answer within {error.timeout_s:g} s; start that peer first, check the address, "
        "or raise --join-timeout-s"
        if error.unreachable
        else "refused"
    )
    reasons = "; ".join(error.reasons.get(a, f"{a}: not tried") for a in error.addresses)
    return f"--join {' '.join(flags)}{also}: {hint} ({reasons})"


def _save_model(peer: Peer, path: str, evaluation: dict[str, Any] | None) -> Path:
    """Write ``--save-model``'s pair (the model and its JSON) under the model lock."""
    if peer.recipe is None:
        raise RuntimeError("the peer has no ModelRecipe to record with --save-model")
    scores = None
    if evaluation is not None:
        keys = ("task", *_scores(evaluation), "test_samples")
        scores = {key: evaluation[key] for key in keys}
    with peer.lock:
        written = save_model(
            path,
            peer.model,
            peer.recipe,
            step=peer.step,
            peer_id=peer.peer_id,
            evaluation=scores,
            byzantine=peer.config.byzantine,
        )
    print(f"saved model {written} and {sidecar_path(written).name}", flush=True)
    return written


async def _write_evaluation(peer: Peer, data: Dataset, args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate on the test split and write ``--eval-out``'s JSON; returns the report: the
    data set's ``task``, its metrics as ``test_<name>``
    (:attr:`workloads.task.Task.metric_names`; ``test_accuracy`` is null for a task without
    accuracy), ``test_samples``, and the peer's exchanges."""
    scores = await asyncio.to_thread(
        peer.trainer.evaluate_task, data.x_test, data.y_test, data.task
    )
    report = {
        "id": peer.peer_id,
        "step": peer.step,
        "task": data.task,
        "num_classes": data.num_classes,
        "test_accuracy": None,
        **{f"test_{name}": value for name, value in scores.items()},
        "test_samples": int(data.y_test.shape[0]),
        "batch_size": args.batch_size,
        "exchanges_ok": peer.health.exchanges_ok,
        "exchanges_failed": peer.health.exchanges_failed,
        "isolated": peer.health.isolated,
        "byzantine": peer.config.byzantine,
    }
    if peer.privacy is not None:
        report["epsilon"] = peer.privacy.epsilon
        report["privacy_stopped"] = peer.privacy.stopped
    _write_atomically(args.eval_out, json.dumps(report))
    return report


def _write_atomically(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file renamed over it, so a reader
    polling for the file never sees half of it."""
    temp = Path(path + ".tmp")
    temp.write_text(text)
    temp.replace(path)


class _Rate:
    """Bytes per second (in + out) since the previous reading."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.last = (time.monotonic(), self._total())
        self.value = 0.0

    def _total(self) -> float:
        return self.peer.metrics.bytes_total("in") + self.peer.metrics.bytes_total("out")

    def read(self) -> float:
        now, total = time.monotonic(), self._total()
        then, before = self.last
        if now - then >= 0.2:
            self.value = (total - before) / (now - then)
            self.last = (now, total)
        return self.value


async def _live_line(peer: Peer, rate: _Rate, stop: asyncio.Event) -> None:
    """One line on stderr, redrawn twice a second by rich: step, loss, neighbours, bytes/s;
    log lines go above it, never onto it (:func:`peer.app.logs.above_live`)."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    def line() -> Text:
        status = _status_line(peer, rate)
        loss = status["loss"]
        neighbours = status["neighbours"]
        assert isinstance(neighbours, list)
        return Text(
            f"peer {peer.peer_id}  step {status['step']}  "
            f"loss {'-' if loss is None else f'{loss:.4f}'}  "
            f"neighbours {len(neighbours)}  {human_bytes(rate.read())}/s"
        )

    console = Console(stderr=True)
    with Live(line(), console=console, auto_refresh=False) as live, above_live(console):
        try:
            while not stop.is_set():
                live.update(line(), refresh=True)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
        finally:  # the last frame stays on screen: the final state
            live.update(line(), refresh=True)


LIVE: tuple[Status, ...] = ("alive", "suspected")
"""The members a status line counts as neighbours (not evicted, not left)."""


def _status_line(peer: Peer, rate: _Rate | None = None) -> dict[str, object]:
    """The status line printed per chunk: id, round, step, loss, bytes, live neighbours
    (and bytes/s with a ``rate``; a straggler's ``compute_s`` and ``slowdown_waited_s``)."""
    status = peer.status()
    line = {
        key: status[key] for key in ("id", "round", "step", "loss", "bytes_in", "bytes_out")
    } | {"neighbours": [m["id"] for m in status["neighbours"] if m["status"] in LIVE]}
    if rate is not None:
        line["bytes_per_s"] = round(rate.read(), 1)
    if status["slowdown"] != 1:  # an emulated straggler (--slowdown): its compute and waits
        line["compute_s"], line["slowdown_waited_s"] = (
            status["compute_s"],
            status["slowdown_waited_s"],
        )
    if status["privacy"] is not None:  # DP-SGD (docs/privacy.md)
        line["epsilon"] = status["privacy"]["epsilon"]
        line["privacy_stopped"] = status["privacy"]["stopped"]
    return line
