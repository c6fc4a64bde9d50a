"""The flags of ``gossipnet peer``: :func:`peer_parser` (every :class:`~peer.node.config.PeerConfig`
field has one flag, ``round_deadline_s`` -> ``--round-deadline-s``; the algorithm settings'
flags come from :data:`gossip.settings.SETTINGS`), and which config fields the flags set
(:data:`CONFIG_FIELDS`). :mod:`peer.app.cli` checks them and runs the peer."""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import fields

from peer.app.usage import (
    OneLineParser,
    add_setting_flags,
)
from peer.node.config import ALGORITHMS, MODES, PeerConfig
from peer.node.topology import topology_names
from workloads.accountant import OPACUS_MISSING
from workloads.optimizers import LOCAL_OPTIMIZERS, SGD_MOMENTUM, check_local_optimizer
from workloads.privacy import ACCOUNTANTS, DEFAULT_DELTA, PRIVACY_FIELDS, SAMPLINGS, PrivacyConfig

__all__ = [
    "CONFIG_FIELDS",
    "DEFAULT_DATASET",
    "NETWORK_FIELDS",
    "PRIVACY_FLAGS",
    "USER_CODE",
    "add_privacy_flags",
    "peer_parser",
    "privacy_config",
]

DEFAULT_DATASET = "synthetic:num_samples=2000,seed=0"
USER_CODE = "or your own MODULE:FACTORY (mymodel.py:MyNet, mypkg.models:make_net)"


def add_optimizer_flags(group: argparse._ArgumentGroup) -> None:
    """The local (inner) optimizer's flags, the same on ``peer`` and ``launch``."""
    group.add_argument(
        "--optimizer",
        choices=LOCAL_OPTIMIZERS,
        default="sgd",
        help="local optimizer (default sgd; adamw is DiLoCo's inner optimizer)",
    )
    group.add_argument("--lr", type=float, default=0.05, help="learning rate (default 0.05)")
    group.add_argument(
        "--momentum",
        type=float,
        help=f"SGD momentum (default {SGD_MOMENTUM}; sgd only: adam and adamw keep their own)",
    )
    group.add_argument(
        "--weight-decay",
        type=float,
        default=0.0,
        help="weight decay (default 0; adamw: decoupled)",
    )


def check_optimizer_flags(args: argparse.Namespace) -> None:
    """The local optimizer's flags checked together (``workloads.optimizers``: the momentum
    is SGD's only); a ``ValueError`` whose message starts with the flag at fault."""
    try:
        check_local_optimizer(
            args.optimizer, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay
        )
    except ValueError as error:
        field, _, reason = str(error).partition(": ")
        raise ValueError(f"--{field.replace('_', '-')}: {reason}") from None


PRIVACY_FLAGS = tuple(f"dp_{name}" for name in PRIVACY_FIELDS)
"""The DP-SGD flags' destinations (``--dp-noise`` -> ``dp_noise``), one per
:data:`workloads.privacy.PRIVACY_FIELDS`, the same on ``peer`` and ``launch``."""


def add_privacy_flags(parser: argparse.ArgumentParser) -> None:
    """The DP-SGD flags (docs/privacy.md), in a group of their own."""
    group = parser.add_argument_group(
        "privacy (DP-SGD per peer, docs/privacy.md; needs pip install 'gossipnet[privacy]')"
    )
    group.add_argument(
        "--dp-noise",
        type=float,
        metavar="SIGMA",
        help="noise multiplier: Gaussian noise of SIGMA * --dp-clip on the summed clipped "
        "per-sample gradients (or give --dp-epsilon to pick it)",
    )
    group.add_argument(
        "--dp-clip", type=float, metavar="C", help="per-sample gradient L2 norm bound (required)"
    )
    group.add_argument(
        "--dp-epsilon",
        type=float,
        metavar="EPS",
        help="target epsilon: training stops before a step would pass it; without --dp-noise "
        "it also picks the noise for --steps steps",
    )
    group.add_argument(
        "--dp-delta", type=float, metavar="DELTA", help=f"delta (default {DEFAULT_DELTA:g})"
    )
    group.add_argument(
        "--dp-sampling",
        choices=SAMPLINGS,
        help="poisson (default: what the accountant assumes) or fixed (--batch-size exactly)",
    )
    group.add_argument(
        "--dp-accountant", choices=ACCOUNTANTS, help="Opacus' rdp (default) or prv accountant"
    )


def privacy_config(args: argparse.Namespace) -> PrivacyConfig | None:
    """The DP-SGD settings the ``--dp-*`` flags give (None without ``--dp-noise``,
    ``--dp-clip`` or ``--dp-epsilon``); a ``ValueError`` whose message starts with the flag
    at fault."""
    given = {
        name: getattr(args, f"dp_{name}")
        for name in PRIVACY_FIELDS
        if getattr(args, f"dp_{name}", None) is not None
    }
    if not given:
        return None
    if not {"noise", "clip", "epsilon"} & set(given):
        first = next(iter(given))
        raise ValueError(
            f"--dp-{first}: applies to DP-SGD only; allowed with --dp-clip and --dp-noise "
            "or --dp-epsilon"
        )
    try:
        config = PrivacyConfig(**given)
    except ValueError as error:
        raise ValueError(f"--dp-{error}") from None
    if config.noise is None and not getattr(args, "steps", 0):
        raise ValueError(
            "--dp-epsilon: without --dp-noise it picks the noise for the run's steps; "
            "allowed: with --steps N (N >= 1), or with --dp-noise SIGMA"
        )
    if config.accountant == "prv" and not getattr(args, "steps", 0):
        raise ValueError(
            "--dp-accountant: prv needs the run's --steps N (its cost grows with the steps); "
            "allowed: rdp, or prv with --steps N"
        )
    if importlib.util.find_spec("opacus") is None:
        raise ValueError(f"--dp-{next(iter(given))}: {OPACUS_MISSING}")
    return config


def peer_parser(prog: str, raise_errors: bool = False) -> OneLineParser:
    parser = OneLineParser(
        prog=prog,
        usage="%(prog)s --id ID [--port PORT] [--join HOST:PORT] [--steps N] [options]",
        description=(
            "Run one gossip-training peer: listen, join a swarm, train a model on this peer's "
            "shard, and average it with neighbours (async AD-PSGD or sync D-PSGD rounds)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "The swarm secret comes from --secret-file or GOSSIPNET_SECRET; without one the "
            "swarm is open (a loud warning). Protocol: docs/protocol.md."
        ),
        raise_errors=raise_errors,
    )
    peer = parser.add_argument_group("peer (PeerConfig)")
    peer.add_argument("--id", dest="peer_id", required=True, help="peer id, [A-Za-z0-9._:-]{1,64}")
    peer.add_argument("--host", help="listen address (default 127.0.0.1)")
    peer.add_argument("--port", type=int, help="listen port, 0 = ephemeral (default)")
    peer.add_argument("--advertise", metavar="HOST:PORT", help="address others should call")
    peer.add_argument("--client-only", action="store_true", help="never listen; needs --join")
    peer.add_argument(
        "--join",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="bootstrap peer (repeatable)",
    )
    peer.add_argument(
        "--join-timeout-s",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="keep retrying --join addresses with backoff this long (default 60)",
    )
    peer.add_argument(
        "--no-fetch-state",
        dest="fetch_state",
        action="store_false",
        help="keep our own initial model instead of copying the bootstrap peer's",
    )
    peer.add_argument(
        "--algorithm",
        help=f"one of {', '.join(ALGORITHMS)} (default ad-psgd, or from --mode); sets --mode",
    )
    peer.add_argument("--mode", choices=MODES, help="async (ad-psgd, default) or sync (dpsgd)")
    add_setting_flags(peer)
    peer.add_argument(
        "--byzantine",
        metavar="ATTACK",
        help="evaluation only: act as a Byzantine member that sends this consensus attack "
        "(sign-flip, gaussian:sigma=1, alie, ...; see gossipnet consensus) instead of its "
        "messages; sync algorithms only",
    )
    peer.add_argument(
        "--fanout",
        type=int,
        default=None,
        help="async: neighbours averaged with per round (default 1, and 2 for a "
        "--client-only peer, which nobody calls); a neighbour that answers busy gives its "
        "place to another, at most 2 a round",
    )
    peer.add_argument("--round-deadline-s", type=float, default=5.0, help="sync: round deadline")
    peer.add_argument("--seed", type=int, default=0)
    peer.add_argument(
        "--topology",
        help="neighbours from a graph over --peers-file: " + ", ".join(topology_names()),
    )
    peer.add_argument(
        "--topology-weights", help="metropolis (default, undirected), max-degree, lazy, uniform"
    )
    peer.add_argument(
        "--peers-file",
        metavar="FILE",
        help="with --topology: every peer's HOST:PORT, one a line (rank r = line r)",
    )
    peer.add_argument("--rank", type=int, help="with --topology: this peer's line in --peers-file")
    peer.add_argument("--device", default="cpu", help="auto, cpu, cuda or cuda:INDEX (default cpu)")
    peer.add_argument(
        "--max-concurrent-exchanges",
        type=int,
        default=8,
        help="exchanges served at once, more get 409 busy (default 8)",
    )
    peer.add_argument(
        "--max-serving-share",
        type=float,
        default=PeerConfig.max_serving_share,
        metavar="SHARE",
        help="while training, the most of this peer's time that serving neighbours' "
        "exchanges may take, in (0, 1]; past it they get 409 busy "
        f"(default {PeerConfig.max_serving_share:g}; 1: no limit)",
    )
    peer.add_argument("--request-timeout-s", type=float, default=10.0)
    peer.add_argument("--suspect-after", type=int, default=1)
    peer.add_argument("--evict-after", type=int, default=3)
    peer.add_argument("--secret-file", help="file holding the swarm secret (>= 16 bytes)")
    peer.add_argument("--clock-window-s", type=int, default=60)
    peer.add_argument("--tls-cert")
    peer.add_argument("--tls-key")
    peer.add_argument("--tls-ca")
    peer.add_argument("--max-body-factor", type=float, default=2.0)
    peer.add_argument("--checkpoint-dir")
    peer.add_argument("--checkpoint-every", type=int, default=0, help="steps, 0 = only at stop")
    peer.add_argument("--keep-checkpoints", type=int, default=3)
    peer.add_argument(
        "--resume", action="store_true", help="start from the newest valid checkpoint"
    )
    peer.add_argument(
        "--no-average-buffers",
        dest="average_buffers",
        action="store_false",
        help="keep this peer's model buffers (BatchNorm running statistics) its own instead "
        "of mixing them with the parameters; the peer warns at start if the model has any",
    )
    work = parser.add_argument_group("workload")
    work.add_argument(
        "--dataset",
        default=DEFAULT_DATASET,
        help=f"workloads spec (mnist1d, synthetic:...), FILE.npz, {USER_CODE}; "
        f"default {DEFAULT_DATASET}",
    )
    work.add_argument("--partition", default="iid", help="iid, dirichlet:alpha=0.5, shards:...")
    work.add_argument("--num-peers", type=int, default=1, help="shards the data is split into")
    work.add_argument("--peer-index", type=int, default=0, help="this peer's shard, 0-based")
    work.add_argument(
        "--model", default="mlp", help=f"workloads model spec (default mlp), {USER_CODE}"
    )
    work.add_argument("--batch-size", type=int, default=32, help="samples per step (default 32)")
    add_optimizer_flags(work)
    add_privacy_flags(parser)
    run = parser.add_argument_group("run")
    run.add_argument("--steps", type=int, default=0, help="optimizer steps, 0 = until a signal")
    run.add_argument("--status-every", type=int, default=50, help="steps between status lines")
    run.add_argument("--address-file", help="write HOST:PORT here once listening (for scripts)")
    run.add_argument(
        "--hold",
        action="store_true",
        help="after --steps, keep serving neighbours (not training) until SIGTERM/SIGINT",
    )
    run.add_argument(
        "--wait-for-peers",
        type=int,
        default=0,
        metavar="K",
        help="before training, wait (up to 60 s) until K other peers are alive",
    )
    run.add_argument(
        "--eval-out",
        metavar="FILE",
        help="at the end, write the test loss and accuracy as JSON to FILE",
    )
    run.add_argument(
        "--save-model",
        metavar="FILE",
        help="write the trained model as safetensors + JSON at the end, see docs/models.md",
    )
    run.add_argument(
        "--log-dir",
        metavar="DIR",
        help="training record in DIR: metrics.csv (step, loss, accuracy, bytes, exchanges) "
        "and TensorBoard event files (tensorboard --logdir DIR), a row per status line and "
        "at the end; MLflow too if installed and MLFLOW_TRACKING_URI is set. Needs "
        "pip install 'gossipnet[logging]'",
    )
    run.add_argument(
        "--progress",
        choices=("auto", "live", "lines"),
        default="auto",
        help="live: one rich line on stderr; lines: JSON lines on stdout; auto: live on a TTY",
    )
    run.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        default="WARNING",
        help="logging to stderr (default WARNING); DEBUG also shows tracebacks",
    )
    run.add_argument("--log-json", action="store_true", help="log one JSON object per line")
    run.add_argument("-v", "--verbose", action="store_true", help="same as --log-level INFO")
    return parser


NETWORK_FIELDS = ("host", "port", "advertise", "join", "peer_list")
"""PeerConfig fields that `gossipnet peer` works out from several flags (``peer.app.cli``)."""
CONFIG_FIELDS = tuple(
    item.name for item in fields(PeerConfig) if item.name not in (*NETWORK_FIELDS, "secret")
)
"""PeerConfig fields set by the flag of the same name (``peer_id`` by ``--id``; the
secret is read from ``--secret-file`` by the peer)."""
