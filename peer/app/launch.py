"""``gossipnet launch`` and ``gossipnet demo``: a local swarm of real peer processes.

``launch --peers N`` starts N ``gossipnet peer`` OS processes on 127.0.0.1 in one process
group (:mod:`peer.app.swarm`: the bootstrap, ``--join``, or a generated peer file with
``--topology``; a fresh swarm secret; peer i trains on shard i). While they run, a live
table or plain lines show each peer's step, loss, neighbours and bytes/s, polled from its
``GET /v1/status`` (:mod:`peer.app.progress`); meanwhile the launcher trains one *centralized*
model on all the data with the peers' combined batch (N x batch size) for as many steps,
i.e. on the same number of samples (:func:`workloads.train_centralized`). At the end every
peer writes its test metrics (``gossipnet peer --eval-out``: the data set's task's, accuracy,
bits per byte or mean squared error, :mod:`workloads.task`) and the launcher prints each
beside the centralized one (:mod:`peer.app.report`). Ctrl-C (or SIGTERM) stops the swarm
cleanly: SIGTERM to the group, a grace for the final checkpoints, evaluations and model
files (``--grace``; by default 15 s, longer while a peer says it is still finishing, up to
10 minutes), then SIGKILL, no orphans; a peer the grace ran out on is named in one line and
its row says why.

``--save-model FILE`` has every peer write its model into the run directory and, at the
end, writes the average of the models of the peers that finished to FILE
(``peer.app.export.average_models``: the swarm's consensus point ``x_bar = (1/n) sum_i x_i``),
rebuilt from ``--model`` (your own code too) and evaluated on the test split: the figure is
printed with the summary and recorded in FILE's description.

``--log-dir DIR`` keeps training records (:mod:`peer.node.logbook`: ``metrics.csv`` and
TensorBoard event files): each peer's own in ``DIR/peer-<i>/`` (its ``--log-dir``), and
the swarm as the launcher saw it in ``DIR/swarm/``: a row per peer each time a poll finds
it at a new step (peer, step, loss, bytes, exchanges), then per peer its final test
accuracy, and the centralized reference's (``peer`` = ``centralized``).
``tensorboard --logdir DIR`` shows them all.

``--resume`` continues a run kept with ``--dir`` (whose peers checkpoint when they stop,
and every ``--checkpoint-every`` steps): each peer restarts from its newest valid checkpoint
and trains on to ``--steps`` in all (:func:`peer.app.swarm.peer_flags`).

This module is the command line and the order of events; ``demo`` is ``launch`` with
defaults picked to finish in under half a minute on two idle CPU cores (the README's one
statement, measured in docs/benchmarks.md): 4 peers, MNIST-1D, an MLP, asynchronous
AD-PSGD. Every flag is checked before any process starts or the baseline trains, each
peer's full command line (``--peer-args`` included) with the peer's own parser
(:func:`peer.app.cli.parse_peer_args`): a mistake is one line and exit code 2.

Exit codes: 0 every peer finished, 1 a peer failed (its reason is shown), 2 bad
arguments, 130 stopped by Ctrl-C/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import signal
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from peer.app.churn import annotate, check_rejoin, parse_crashes, parse_stragglers, run_crashes
from peer.app.peer_flags import (
    PARTITION_HELP,
    add_link_flags,
    add_optimizer_flags,
    add_privacy_flags,
    check_optimizer_flags,
)
from peer.app.progress import watch
from peer.app.report import collect_results, print_results, test_metrics
from peer.app.swarm import (
    GRACE_LIMIT_S,
    GRACE_S,
    PeerProcess,
    Swarm,
    byzantine_peers,
    peer_flags,
)
from peer.app.usage import OneLineParser, UsageError, add_setting_flags, flag_namer
from peer.node.config import ALGORITHMS, MODES
from peer.node.logbook import Logbook, LogbookError, check_log_dir
from peer.node.topology import topology_names
from workloads.baseline import CentralizedResult
from workloads.cache import default_cache_dir

DEMO_DEFAULTS = (
    "--peers", "4", "--dataset", "mnist1d:num_samples=4000", "--model", "mlp",
    "--steps", "600", "--batch-size", "32", "--lr", "0.05", "--momentum", "0.9",
    "--algorithm", "ad-psgd",
)  # fmt: skip
"""What ``gossipnet demo`` runs (any of it can be overridden on the command line)."""


def with_cache(dataset: str) -> str:
    """An ``mnist1d`` spec with a ``cache_dir``, so N peers do not each regenerate it."""
    name, _, rest = dataset.partition(":")
    if name.strip() != "mnist1d" or "cache_dir" in rest:
        return dataset
    path = default_cache_dir() / "mnist1d"
    return f"{name}:{rest + ',' if rest else ''}cache_dir={path}"


def _parser(prog: str, demo: bool) -> argparse.ArgumentParser:
    what = "the demo" if demo else "a local swarm"
    parser = OneLineParser(
        prog=prog,
        description=(
            f"Run {what}: N gossipnet peer processes on 127.0.0.1 train one model together; "
            "a live table shows their progress, and at the end each peer's test metric is "
            "printed beside a centralized run on the same data and number of samples."
        ),
        epilog="Every option but --peers, --client-only, --stragglers, --crashes, --resume, "
        "--grace, --no-centralized, --dir, --json, --progress, --save-model, --log-dir, "
        "--byzantine-peers, --peer-args and --peer-args-for is passed to each peer unchanged. "
        "An experiment file instead of flags: gossipnet launch EXPERIMENT.toml "
        "(docs/prediction.md). Guide: docs/peer.md.",
    )
    swarm = parser.add_argument_group("swarm")
    swarm.add_argument(
        "--peers", type=int, default=4, help="number of peer processes, 2-64 (default %(default)s)"
    )
    swarm.add_argument(
        "--client-only",
        type=int,
        default=0,
        metavar="K",
        help="the last K peers never listen (default %(default)s)",
    )
    swarm.add_argument("--algorithm", help=", ".join(ALGORITHMS) + " (default ad-psgd)")
    swarm.add_argument(
        "--mode",
        choices=MODES,
        help="async (ad-psgd) or sync (dpsgd) (default: from --algorithm, else async)",
    )
    add_setting_flags(swarm)
    swarm.add_argument(
        "--byzantine",
        metavar="K:ATTACK",
        help="evaluation: the last K peers are Byzantine and send ATTACK (a consensus attack, "
        "e.g. 1:sign-flip); their accuracy is reported apart from the honest peers' "
        "(default: none)",
    )
    swarm.add_argument(
        "--byzantine-peers",
        metavar="IDS",
        help="which K peers of --byzantine are Byzantine: ids and ranges, e.g. 2,5-6 "
        "(default: the last K)",
    )
    swarm.add_argument(
        "--stragglers",
        metavar="PEER=FACTOR[,...]",
        help="emulated stragglers (the simulator's [network] stragglers): each local step of "
        "those peers takes FACTOR (>= 1) times its compute (their --slowdown); PEER is an id "
        "or a range A-B, e.g. 3=3 or 0-1=2,5=4 (default: none)",
    )
    swarm.add_argument(
        "--crashes",
        metavar="PEER@AT[+DOWN][,...]",
        help="churn (the simulator's [network] crashes, rejoin = AT + DOWN): SIGKILL peer "
        "PEER AT seconds after the swarm starts training and, with +DOWN, start it again DOWN "
        "seconds later from its newest checkpoint (it checkpoints every 5%% of --steps unless "
        "--checkpoint-every says otherwise; +DOWN not with push-sum or choco); a peer down at "
        "the end is left out of the means; e.g. 2@10+5,3@20 (default: none)",
    )
    swarm.add_argument(
        "--fanout",
        type=int,
        help="async: neighbours each peer averages with per round (default: the peer's, 1; "
        "2 for a client-only peer)",
    )
    swarm.add_argument(
        "--round-deadline-s",
        type=float,
        metavar="SECONDS",
        help="sync: how long a round waits for neighbours (default: the peer's, 5)",
    )
    swarm.add_argument(
        "--topology",
        help="one of "
        + ", ".join(topology_names())
        + " (default: none, each peer picks random neighbours)",
    )
    swarm.add_argument(
        "--topology-weights",
        help="metropolis, max-degree, lazy, uniform (default: metropolis, uniform if directed)",
    )
    swarm.add_argument("--device", help="auto, cpu, cuda, cuda:I (default: the peer's, cpu)")
    swarm.add_argument(
        "--max-serving-share",
        type=float,
        metavar="SHARE",
        help="each peer's limit on the share of its training time spent serving exchanges, "
        "in (0, 1] (default: the peer's)",
    )
    swarm.add_argument(
        "--checkpoint-every",
        type=int,
        help="steps between each peer's checkpoints, in --dir (default: none; with --dir "
        "each peer still checkpoints when it stops, for --resume)",
    )
    swarm.add_argument(
        "--log-level",
        help="peers' log level; their stderr goes to --dir (default: the peer's, WARNING)",
    )
    swarm.add_argument(
        "--resume",
        action="store_true",
        help="continue the run kept in --dir from each peer's newest checkpoint "
        "(DIR/peer-<i>.checkpoints: written when a peer stops, whenever --dir is given, and "
        "every --checkpoint-every steps); each peer trains on to --steps in all, and the "
        "centralized reference is trained again (default: a new run)",
    )
    swarm.add_argument(
        "--grace",
        type=float,
        metavar="SECONDS",
        help="at the end (or on Ctrl-C), how long the stopped peers get to checkpoint, "
        "evaluate and save before they are killed (default: "
        f"{GRACE_S:g} s, longer while a peer says it is still evaluating or saving, up to "
        f"{GRACE_LIMIT_S:g} s)",
    )
    swarm.add_argument(
        "--peer-args",
        default="",
        metavar="ARGS",
        help="more peer flags, one shell-quoted string (default: none)",
    )
    swarm.add_argument(
        "--peer-args-for",
        action="append",
        default=[],
        metavar="IDS=ARGS",
        help="more flags for some peers only, after --peer-args: ids and ranges, '=', one "
        "shell-quoted string, e.g. '3=--latency 100ms' or '0-1=--bandwidth 10Mbit' (a slow "
        "uplink; repeatable; default: none)",
    )
    add_link_flags(parser, who="each peer", pass_through=True)
    work = parser.add_argument_group("workload")
    work.add_argument(
        "--dataset",
        default="mnist1d:num_samples=4000",
        help="workloads spec, FILE.npz, or your MODULE:FACTORY (default %(default)s)",
    )
    work.add_argument(
        "--partition",
        default="iid",
        help=PARTITION_HELP,
    )
    work.add_argument(
        "--model",
        default="mlp",
        help="workloads model spec, or your MODULE:FACTORY (mymodel.py:MyNet) "
        "(default %(default)s)",
    )
    work.add_argument(
        "--batch-size", type=int, default=32, help="samples per step (default %(default)s)"
    )
    add_optimizer_flags(work)
    work.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds the partition, the initial model, the batches (default %(default)s)",
    )
    work.add_argument(
        "--steps", type=int, default=500, help="optimizer steps per peer (default %(default)s)"
    )
    work.add_argument(
        "--no-centralized",
        action="store_true",
        help="do not train the centralized reference beside the swarm (one more model "
        "trained on this machine: skip it for a large model; default: trained)",
    )
    add_privacy_flags(parser)
    out = parser.add_argument_group("output")
    out.add_argument(
        "--dir",
        help="keep the run's files here: logs, results, checkpoints (default: a temporary "
        "folder, removed after a clean run)",
    )
    out.add_argument(
        "--progress",
        choices=("auto", "live", "lines", "none"),
        default="auto",
        help="live table (rich), plain lines every few seconds, or nothing; auto: live on a TTY "
        "(default %(default)s)",
    )
    out.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    out.add_argument(
        "--eval-every",
        type=int,
        metavar="N",
        help="each peer evaluates on the test split at step 0 and every N steps, timed, into "
        "DIR/peer-<i>.evals.jsonl (the run's curve; gossipnet sim predict reads it; "
        "default: only the final evaluation)",
    )
    out.add_argument(
        "--save-model",
        metavar="FILE",
        help="write the average of the finished peers' models as safetensors + JSON to FILE, "
        "evaluated on the test split (the figure is printed and recorded; docs/models.md; default: none)",
    )
    out.add_argument(
        "--log-dir",
        metavar="DIR",
        help="training records as metrics.csv + TensorBoard event files: each peer's in "
        "DIR/peer-<i>/, and the swarm's view in DIR/swarm/ (every peer's step, loss, bytes "
        "and exchanges as polled, then each final test accuracy and the centralized one); "
        "view with tensorboard --logdir DIR. Needs pip install 'gossipnet[logging]' "
        "(default: none)",
    )
    if demo:  # the demo's defaults are the defaults its --help shows
        chosen = set(DEMO_DEFAULTS[::2])
        given = vars(parser.parse_args(DEMO_DEFAULTS))
        parser.set_defaults(
            **{
                action.dest: given[action.dest]
                for action in parser._actions
                if chosen & set(action.option_strings)
            }
        )
    return parser


def _check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if not 2 <= args.peers <= 64:
        parser.error(f"--peers: must be an integer in [2, 64], got {args.peers}")
    if not 0 <= args.client_only < args.peers:
        parser.error(f"--client-only: must be in [0, --peers={args.peers}), got {args.client_only}")
    if args.client_only and args.topology:
        parser.error("--client-only: cannot be combined with --topology (every rank listens)")
    if args.steps < 1:
        parser.error(f"--steps: must be >= 1, got {args.steps}")
    if args.grace is not None and not 0 <= args.grace <= 86400:
        parser.error(f"--grace: must be seconds in [0, 86400], got {args.grace:g}")
    if args.batch_size < 1:
        parser.error(f"--batch-size: must be >= 1, got {args.batch_size}")
    if args.eval_every is not None and args.eval_every < 1:
        parser.error(f"--eval-every: must be >= 1, got {args.eval_every}")
    try:
        check_optimizer_flags(args)
    except ValueError as error:
        parser.error(str(error))
    try:
        shlex.split(args.peer_args)
    except ValueError as error:
        parser.error(f"--peer-args: must be shell-quoted flags: {error}")
    args.peer_args_of = _peer_args_for(args, parser)
    if args.save_model is not None:
        target = Path(args.save_model)
        if not target.parent.is_dir():
            parser.error(f"--save-model: folder {target.parent} does not exist (for {target})")
        if target.suffix == ".json":
            parser.error("--save-model: FILE must not end in .json (FILE.json is its description)")
    if args.log_dir is not None:
        try:
            check_log_dir(Path(args.log_dir) / "swarm", peer_column=True)
        except LogbookError as error:
            parser.error(str(error))
    try:
        args.slowdowns = parse_stragglers(args.stragglers, args.peers)
        args.crash_plan = parse_crashes(args.crashes, args.peers)
        if any(crash.rejoin is not None for crash in args.crash_plan):
            check_rejoin(args.algorithm, args.mode)
    except ValueError as error:
        parser.error(str(error))
    args.byzantine_count, args.byzantine_attack = _byzantine(args, parser)
    args.resumed = _resumed(args, parser) if args.resume else None
    _check_peer_options(args, parser)


def _resumed(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[int, int]:
    """``--resume``: the step of each peer's newest valid checkpoint in ``--dir`` (peer index
    -> step; the one each peer's own ``--resume`` will load), checked against the launch."""
    from peer.node.checkpoint import CheckpointError, load_latest

    if args.dir is None:
        parser.error("--resume: needs --dir DIR, the folder of the run to resume")
    folder = Path(args.dir)
    found: dict[int, int] = {}
    for path in sorted(folder.glob("peer-*.checkpoints")):
        index = path.name.removeprefix("peer-").removesuffix(".checkpoints")
        if not index.isdigit():
            continue
        try:
            checkpoint = load_latest(path)
        except CheckpointError as error:
            parser.error(f"--resume: {error}")
        if checkpoint is not None:
            found[int(index)] = checkpoint.step
    if not found:
        parser.error(
            f"--resume: no checkpoint in {folder}/peer-<i>.checkpoints; keep a run with --dir "
            "DIR (its peers checkpoint when they stop, and every --checkpoint-every steps)"
        )
    if max(found) >= args.peers:
        parser.error(
            f"--resume: {folder} holds checkpoints of peer-{max(found)}; resume with the "
            f"run's own --peers (at least {max(found) + 1}), got {args.peers}"
        )
    if len(found) == args.peers and min(found.values()) >= args.steps:
        parser.error(
            f"--resume: every peer's checkpoint is at step {min(found.values())} or later, "
            f"already --steps {args.steps}; raise --steps to train further"
        )
    return found


def _peer_args_for(
    args: argparse.Namespace, parser: argparse.ArgumentParser
) -> dict[int, list[str]]:
    """``--peer-args-for IDS=ARGS`` (repeatable) as peer index -> its extra flags, in the
    order given."""
    from workloads.partition import parse_id_set

    extra: dict[int, list[str]] = {}
    for given in args.peer_args_for:
        ids, equals, flags = str(given).partition("=")
        if not equals:
            parser.error(
                f"--peer-args-for: must be IDS=ARGS (e.g. '3=--latency 100ms'), got {given!r}"
            )
        try:
            indices = parse_id_set(ids, "--peer-args-for")
            split = shlex.split(flags)
        except ValueError as error:
            parser.error(f"--peer-args-for: {error}")
        outside = [index for index in indices if index >= args.peers]
        if outside:
            parser.error(
                f"--peer-args-for: peer {outside[0]} is outside 0..{args.peers - 1} (--peers)"
            )
        for index in indices:
            extra.setdefault(index, []).extend(split)
    return extra


def _byzantine(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[int, str | None]:
    """``--byzantine K:ATTACK`` as (K, ATTACK); (0, None) without it. Sets
    ``args.byzantine_set``, the K peers: ``--byzantine-peers``, else the last K."""
    args.byzantine_set = frozenset()
    if args.byzantine is None:
        if args.byzantine_peers is not None:
            parser.error("--byzantine-peers: needs --byzantine K:ATTACK (the attack they send)")
        return 0, None
    count, colon, attack = str(args.byzantine).partition(":")
    if not colon or not count.strip().isdigit() or not attack.strip():
        parser.error(f"--byzantine: must be K:ATTACK (e.g. 1:sign-flip), got {args.byzantine!r}")
    if not 1 <= int(count) < args.peers - args.client_only:
        parser.error(
            f"--byzantine: K must be in [1, {args.peers - args.client_only}) (at least one "
            f"honest listening peer), got {int(count)}"
        )
    chosen: Sequence[int] = range(args.peers - int(count), args.peers)
    if args.byzantine_peers is not None:
        from workloads.partition import parse_id_set

        try:
            chosen = parse_id_set(args.byzantine_peers, "--byzantine-peers")
        except ValueError as error:
            parser.error(str(error))
        outside = [index for index in chosen if index >= args.peers - args.client_only]
        if outside:
            parser.error(
                f"--byzantine-peers: peer {outside[0]} is outside the listening peers "
                f"0..{args.peers - args.client_only - 1}"
            )
        if len(chosen) != int(count):
            parser.error(
                f"--byzantine-peers: names {len(chosen)} peers, --byzantine says K = {int(count)}"
            )
    args.byzantine_set = frozenset(chosen)
    return int(count), attack.strip()


def _check_peer_options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Every peer's command line, checked here with the peer's own parser and validation
    (:func:`peer.app.cli.parse_peer_args`: ``PeerConfig``, hence ``gossip.GossipConfig``, the
    simulator's check too; the workload specs; the user's code): one clear line now, not N
    failed peers after the baseline has trained. The launcher's own options are checked
    first, then with ``--peer-args`` added, so a mistake is blamed on the right flag."""
    from peer.app.cli import parse_peer_args

    with tempfile.TemporaryDirectory(prefix="gossipnet-check-") as scratch:
        folder = Path(scratch)
        peer_file = None
        if args.topology:
            peer_file = folder / "peers.txt"
            peer_file.write_text("".join(f"127.0.0.1:{7000 + i}\n" for i in range(args.peers)))
        listening = args.peers - args.client_only
        for index in sorted({0, args.peers - 1, *args.peer_args_of}):
            extra = ["--client-only", "--join", "127.0.0.1:7000"] if index >= listening else []
            flags = peer_flags(args, index, folder, secret_file=None, peer_file=peer_file)
            given = len(shlex.split(args.peer_args)) + len(args.peer_args_of.get(index, ()))
            own = flags[: len(flags) - given] if given else flags
            try:
                _, config = parse_peer_args([*own, *extra], raise_errors=True)
            except UsageError as error:
                parser.error(str(error))
            try:
                parse_peer_args([*flags, *extra], raise_errors=True)
            except UsageError as error:
                blamed = "--peer-args-for" if index in args.peer_args_of else "--peer-args"
                parser.error(f"{blamed}: {error}")
    caveat = config.gossip.topology_caveat(args.topology)
    if caveat is not None:
        print(f"warning: {caveat}", file=sys.stderr)
    if not args.topology and config.mode == "sync":
        from gossip.settings import ConfigurationError

        try:  # without a topology a sync peer mixes every other member: N models in all
            config.gossip.check_neighbourhood(
                args.peers, where=f"--peers {args.peers} without --topology"
            )
        except ConfigurationError as error:
            parser.error(error.render(flag_namer(parser)))
    if args.device and args.device != "cpu":
        from peer.node.config import resolve_device

        try:
            resolve_device(args.device)
        except ValueError as error:
            parser.error(f"--device: {error}")


def _check_fit(args: argparse.Namespace, data: Any, parser: argparse.ArgumentParser) -> None:
    """The model against the data, one forward pass of one batch, before any peer starts
    (:func:`peer.app.run.check_fit`): a mismatch is one line naming ``--model`` and
    ``--dataset``, exit code 2."""
    from peer.app.run import check_fit
    from workloads import build_model

    try:
        model = build_model(args.model, data.input_shape, data.num_classes, seed=args.seed)
        check_fit(model, data, args.model, args.dataset)
    except ValueError as error:
        message = str(error)
        parser.error(message if message.startswith("--model") else f"--model: {message}")


def _train_baseline(
    args: argparse.Namespace, dataset: str, stop: threading.Event
) -> CentralizedResult:
    """The centralized reference of this launch, trained in this process (one thread; the
    launcher is idle anyway). Setting ``stop`` ends it early (Ctrl-C)."""
    try:
        import torch

        from workloads import build_model, load_dataset, train_centralized

        torch.set_num_threads(1)
        data = load_dataset(dataset)
        model = build_model(args.model, data.input_shape, data.num_classes, seed=args.seed)
        return train_centralized(
            model,
            data,
            steps=args.steps,
            batch_size=args.peers * args.batch_size,
            seed=args.seed,
            optimizer=check_optimizer_flags(args),
            stream=args.peers,
            stop=stop,
        )
    except Exception as error:  # shown in the final table instead of a traceback
        return CentralizedResult(error=f"{type(error).__name__}: {error}")


async def _launch(
    swarm: Swarm, args: argparse.Namespace, progress: str, logbook: Logbook | None
) -> bool:
    """Start the peers, watch them (recording in ``logbook``); True if stopped by a signal."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if not await swarm.start(stop):
        return True
    if progress != "none" and progress != "live":
        print(
            f"launched {args.peers} peers (files in {swarm.directory}); {args.steps} steps each",
            file=sys.stderr,
            flush=True,
        )
    churn = None
    if args.crash_plan:
        churn = asyncio.create_task(
            run_crashes(swarm, args.crash_plan, stop, lambda line: _say("gossipnet launch", line))
        )
    try:
        await watch(swarm, progress, stop, logbook)
    finally:
        if churn is not None:
            churn.cancel()
            [outcome] = await asyncio.gather(churn, return_exceptions=True)
            if isinstance(outcome, Exception):
                raise RuntimeError(f"--crashes: {type(outcome).__name__}: {outcome}")
    return stop.is_set()


def main(
    argv: Sequence[str],
    prog: str = "gossipnet launch",
    *,
    demo: bool = False,
    origins: dict[str, str] | None = None,
) -> int:
    """``gossipnet launch``: check the flags, start the swarm and the centralized reference,
    watch, print the results; returns the exit code (see the module's docstring).
    ``origins``: flag -> the experiment file's key it came from (``gossipnet launch
    EXPERIMENT.toml``, :mod:`gossipnet.experiment_launch`), named first in an error."""
    parser = _parser(prog, demo)
    if origins and isinstance(parser, OneLineParser):
        parser.origins = dict(origins)
    args = parser.parse_args([*(DEMO_DEFAULTS if demo else ()), *argv])
    try:
        return _run(args, parser, prog)
    except KeyboardInterrupt:  # Ctrl-C before the swarm's own handler was installed
        print(f"{prog}: stopped before the swarm started", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser, prog: str) -> int:
    _check(args, parser)
    progress = args.progress
    if progress == "auto":
        progress = "live" if sys.stderr.isatty() else "lines"
    dataset = with_cache(args.dataset)
    try:
        from workloads import load_dataset

        data = load_dataset(dataset)  # fail fast on a bad spec; fills the cache for the peers
    except (ValueError, ImportError, OSError) as error:
        parser.error(f"--dataset: {error}")
    _check_fit(args, data, parser)
    args.dataset = dataset
    if args.resumed is not None:
        where = ", ".join(f"peer-{i} at step {step}" for i, step in sorted(args.resumed.items()))
        print(f"{prog}: resuming {args.dir}: {where}; on to step {args.steps}", file=sys.stderr)
    keep = args.dir is not None
    if keep:
        directory = Path(args.dir)
        directory.mkdir(parents=True, exist_ok=True)
    else:
        directory = Path(tempfile.mkdtemp(prefix="gossipnet-launch-"))
    logbook = None
    if args.log_dir is not None:
        try:
            logbook = Logbook.open(Path(args.log_dir) / "swarm", run_name="swarm", peer_column=True)
        except LogbookError as error:
            parser.error(str(error))
    try:
        swarm = Swarm(args, directory)
        baseline: list[CentralizedResult] = []
        halt = threading.Event()
        reference = None
        if args.no_centralized:
            baseline.append(CentralizedResult(error="not trained (--no-centralized)"))
        else:
            reference = threading.Thread(
                target=lambda: baseline.append(_train_baseline(args, dataset, halt)), daemon=True
            )
            reference.start()
        interrupted = False
        failed: str | None = None
        try:
            interrupted = asyncio.run(_launch(swarm, args, progress, logbook))
        except RuntimeError as error:
            failed = str(error)
        finally:
            if interrupted or failed:
                halt.set()
            killed = swarm.stop(args.grace, say=lambda line: _say(prog, line))
            if killed:
                _say(prog, _killed_line(killed, args.grace))
        if reference is not None:
            reference.join()
        results = collect_results(swarm, baseline[0] if baseline else CentralizedResult())
        churned = annotate(results, swarm)
        if logbook is not None:
            record_results(logbook, swarm, results)
    finally:
        if logbook is not None:
            logbook.close()
    if args.save_model is not None:
        results["model"], results["model_evaluation"], problem = _save_average(swarm, args)
        failed = failed or problem
    print_results(results, args)
    for line in churned:
        _say(prog, line)
    bad = [p for p in results["peers"] if "error" in p]
    if results.get("model"):
        print(f"{prog}: {args.model_note}", file=sys.stderr)
    if args.json:
        print(json.dumps(results), flush=True)
    if failed is not None:
        print(f"{prog}: error: {failed}", file=sys.stderr)
    for entry in bad:
        print(f"{prog}: {entry['id']} failed: {entry['error']}", file=sys.stderr)
    if not keep and not interrupted and not bad and failed is None:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)
    elif not keep:
        print(f"{prog}: run files kept in {directory}", file=sys.stderr)
    if interrupted:
        return 130
    return 1 if bad or failed else 0


def _say(prog: str, line: str) -> None:
    print(f"{prog}: {line}", file=sys.stderr, flush=True)


def _killed_line(killed: Sequence[PeerProcess], grace: float | None) -> str:
    """One line for the peers the grace ran out on: who, doing what, and the flag."""
    which = "; ".join(f"{peer.peer_id} {peer.killed}" for peer in killed)
    hint = (
        f"--grace {grace:g} was too short for them; raise it"
        if grace is not None
        else f"raise --grace (default {GRACE_S:g} s, up to {GRACE_LIMIT_S:g} s while a peer "
        "is still finishing)"
    )
    return f"the grace for stopping ran out: {which}; {hint}"


def record_results(logbook: Logbook, swarm: Swarm, results: dict[str, Any]) -> None:
    """The last rows of the swarm's record (``--log-dir``): each peer that evaluated, at
    its final step with its last polled status and its test accuracy (blank for a model
    without one) and test loss; then the centralized reference's (``peer`` =
    ``centralized``, at ``--steps``)."""
    polled = {peer.peer_id: peer.status for peer in swarm.peers}
    for entry in results["peers"]:
        if "test_loss" not in entry:
            continue  # failed or stopped before evaluating: its polled rows say where
        status = {
            **polled.get(entry["id"], {}),
            "step": entry["step"],
            "exchanges_ok": entry.get("exchanges_ok"),
            "exchanges_failed": entry.get("exchanges_failed"),
        }
        status.pop("exchanges", None)  # the evaluation's counts are the final ones
        logbook.record_status(status, peer=entry["id"], **test_metrics(entry))
    centralized = results["centralized"]
    if centralized.get("test_loss") is not None:
        logbook.record_status(
            {"step": results["steps"]}, peer="centralized", **test_metrics(centralized)
        )


def _save_average(
    swarm: Swarm, args: argparse.Namespace
) -> tuple[str | None, dict[str, Any] | None, str | None]:
    """``--save-model FILE``: the average of the models the honest peers that did not fail
    wrote (``x_bar = (1/n) sum_i x_i``, :func:`peer.app.export.average_models`), rebuilt
    from ``--model`` and evaluated on the test split of ``--dataset`` (recorded in FILE's
    description). Returns FILE (or None), its evaluation and a one-line problem (or None);
    sets ``args``' note for the summary line."""
    from peer.app.export import ExportError, average_models
    from peer.node.model_file import sidecar_path
    from workloads import MODELS, load_dataset
    from workloads.user_code import parse_code_spec

    byzantine = byzantine_peers(args)
    sources = [
        peer.model_file
        for peer in swarm.peers
        if peer.index not in byzantine and not peer.failed() and peer.model_file.is_file()
    ]
    if not sources:
        return None, None, "--save-model: no peer wrote a model to average"
    try:
        written = average_models(
            sources,
            Path(args.save_model),
            factory=args.model if parse_code_spec(args.model, MODELS) is not None else None,
            dataset=load_dataset(args.dataset),
        )
    except (ExportError, ValueError, OSError, RuntimeError) as error:  # one line, no traceback
        return None, None, f"--save-model: {' '.join(str(error).split())[:300]}"
    evaluation = json.loads(sidecar_path(written).read_text())["evaluation"]
    accuracy, loss = evaluation.get("test_accuracy"), evaluation.get("test_loss")
    figure = (
        f"; its test accuracy {100 * accuracy:.1f}%"
        if isinstance(accuracy, float)
        else f"; its test loss {loss:.4f}"
        if isinstance(loss, float)
        else ""
    )
    args.model_note = f"saved the average of {len(sources)} peers' models to {written}{figure}"
    return str(written), evaluation, None


def demo_main(argv: Sequence[str], prog: str = "gossipnet demo") -> int:
    """``gossipnet demo``: :func:`main` with :data:`DEMO_DEFAULTS`."""
    return main(argv, prog, demo=True)
