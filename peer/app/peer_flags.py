"""The flags of ``gossipnet peer``: :func:`peer_parser` (every :class:`~peer.node.config.PeerConfig`
field has one flag, ``round_deadline_s`` -> ``--round-deadline-s``; the algorithm settings'
flags come from :data:`gossip.settings.SETTINGS`), and which config fields the flags set
(:data:`CONFIG_FIELDS`). :mod:`peer.app.cli` checks them and runs the peer."""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable
from dataclasses import fields

from peer.app.usage import (
    DeprecatedFlag,
    OneLineParser,
    add_setting_flags,
)
from peer.node.config import ALGORITHMS, MODES, PeerConfig
from peer.node.topology import topology_names
from peer.transport.shaping import (
    BANDWIDTH_FORMS,
    DURATION_FORMS,
    LOSS_FORMS,
    parse_bandwidth,
    parse_duration,
    parse_loss,
)
from workloads.accountant import OPACUS_MISSING
from workloads.optimizers import (
    LOCAL_OPTIMIZERS,
    OPTIMIZER_KEYS,
    SCHEDULES,
    SGD_MOMENTUM,
    LocalOptimizer,
)
from workloads.partition import PARTITIONS
from workloads.privacy import ACCOUNTANTS, DEFAULT_DELTA, PRIVACY_FIELDS, SAMPLINGS, PrivacyConfig

__all__ = [
    "CONFIG_FIELDS",
    "DEFAULT_DATASET",
    "NETWORK_FIELDS",
    "OPTIMIZER_FLAGS",
    "PARTITION_HELP",
    "PRIVACY_FLAGS",
    "USER_CODE",
    "add_link_flags",
    "add_optimizer_flags",
    "add_privacy_flags",
    "check_optimizer_flags",
    "peer_parser",
    "privacy_config",
]

DEFAULT_DATASET = "synthetic:num_samples=2000,seed=0"
USER_CODE = "or your own MODULE:FACTORY (mymodel.py:MyNet, mypkg.models:make_net)"

PARTITION_HELP = (
    "how the data is split among the peers: "
    + ", ".join(PARTITIONS)
    + ", with their parameters (dirichlet:alpha=0.5, shards:shards_per_peer=2; contiguous: "
    "runs in the data's order, on text each peer its own files; `gossipnet workloads list`) "
    "(default iid)"
)
"""``--partition``'s help, for ``gossipnet peer`` and ``launch``: the registry's names."""


OPTIMIZER_FLAGS = tuple("optimizer" if key == "name" else key for key in OPTIMIZER_KEYS)
"""The ``args`` names of the local optimizer's flags (:func:`add_optimizer_flags`), which
``launch`` hands to every peer as given."""

_DEFAULTS = {"name": "sgd", "lr": 0.05, "weight_decay": 0.0}
"""The flags' defaults (the rest: not given; SGD's momentum then :data:`SGD_MOMENTUM`)."""
_SHOWN_DEFAULTS = {
    item.name: item.default
    for item in fields(LocalOptimizer)
    if item.default is not None and item.name not in ("nesterov", "decay_steps")
}
"""The defaults a flag's help shows (``--decay-steps`` says its own; ``--nesterov``: off)."""
_METAVARS = {"betas": "B1,B2", "nesterov": "BOOL", "schedule": "NAME"}
_TYPES: dict[str, type] = {
    "lr": float, "momentum": float, "eps": float, "weight_decay": float, "min_lr": float,
    "gamma": float, "clip_norm": float, "warmup_steps": int, "decay_steps": int,
    "step_size": int,
}  # fmt: skip


def _true_or_false(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"must be true or false, got {text!r}")
    return text.lower() == "true"


def add_optimizer_flags(group: argparse._ArgumentGroup) -> None:
    """The local (inner) optimizer's flags, the same on ``peer`` and ``launch``: one per key
    of :data:`workloads.optimizers.OPTIMIZER_KEYS` (the simulator's ``[optimizer]`` table's
    keys with dashes; ``name`` is ``--optimizer``)."""
    for key in OPTIMIZER_KEYS.values():
        readers = ""
        if key.optimizers != LOCAL_OPTIMIZERS:
            readers = f"{', '.join(key.optimizers)} only: "
        elif key.schedules != SCHEDULES:
            readers = f"{', '.join(key.schedules)} schedule only: "
        default = _DEFAULTS.get(key.name)
        shown = _DEFAULTS.get(key.name, _SHOWN_DEFAULTS.get(key.name))
        if key.name == "momentum":
            shown = SGD_MOMENTUM
        if isinstance(shown, tuple):
            shown = ",".join(f"{value:g}" for value in shown)
        elif isinstance(shown, float | int) and not isinstance(shown, bool):
            shown = f"{shown:g}"
        if key.name == "nesterov":
            shown = "false"
        help_text = (
            readers + key.help + (" (default: none)" if shown is None else f" (default {shown})")
        )
        if key.name == "name":
            group.add_argument(
                "--optimizer",
                choices=LOCAL_OPTIMIZERS,
                default="sgd",
                help="local optimizer (default sgd; adamw is DiLoCo's inner optimizer)",
            )
        elif key.name == "nesterov":
            group.add_argument(
                "--nesterov",
                nargs="?",
                const=True,
                type=_true_or_false,
                metavar=_METAVARS["nesterov"],
                help=help_text,
            )
        elif key.name in ("betas", "schedule"):
            choices = SCHEDULES if key.name == "schedule" else None
            group.add_argument(
                key.flag, choices=choices, metavar=_METAVARS[key.name], help=help_text
            )
        else:
            group.add_argument(key.flag, type=_TYPES[key.name], default=default, help=help_text)


def _flag_type(parse: Callable[[str], float]) -> Callable[[str], float]:
    """``parse`` as an argparse type: its ``ValueError`` becomes the flag's one-line error."""

    def convert(text: str) -> float:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = parse.__name__
    return convert


def add_link_flags(
    parser: argparse.ArgumentParser, *, who: str = "this peer", pass_through: bool = False
) -> None:
    """The emulated link's flags (``peer.transport.shaping``), the same on ``peer`` and
    ``launch``: their own group, the simulator's ``[network]`` names; each value is stored in
    the simulator's units (seconds, bytes per second, a probability). ``pass_through``
    (``launch``): every default is ``None``, so a flag not given is not passed on."""
    group = parser.add_argument_group(
        "emulated link",
        f"shape every model {who} sends (its uplink) over any network, loopback included: "
        "no root, no netem; unset: not shaped",
    )
    group.add_argument(
        "--latency",
        type=_flag_type(parse_duration),
        default=None if pass_through else 0.0,
        metavar="TIME",
        help=f"one-way delay of each message; {DURATION_FORMS} (default 0)",
    )
    group.add_argument(
        "--bandwidth",
        type=_flag_type(parse_bandwidth),
        default=None,
        metavar="RATE",
        help=f"uplink rate, a token bucket on the bytes sent; {BANDWIDTH_FORMS} "
        "(default: unlimited)",
    )
    group.add_argument(
        "--jitter",
        type=_flag_type(parse_duration),
        default=None if pass_through else 0.0,
        metavar="TIME",
        help="each message's delay uniform in latency +- jitter (seeded by --seed; default 0)",
    )
    group.add_argument(
        "--message-loss",
        type=_flag_type(parse_loss),
        default=None if pass_through else 0.0,
        metavar="P",
        help="each message lost with probability P (seeded by --seed); "
        + LOSS_FORMS.replace("%", "%%")
        + " (default 0)",
    )


def check_optimizer_flags(args: argparse.Namespace) -> LocalOptimizer:
    """The local optimizer the flags describe, for this run's ``--steps`` (0: until a
    signal; a cosine schedule then needs ``--decay-steps``); a ``ValueError`` whose message
    starts with the flag at fault (``--momentum: optimizer adamw does not read it ...``)."""
    keys = {
        key: getattr(args, flag)
        for key, flag in zip(OPTIMIZER_KEYS, OPTIMIZER_FLAGS, strict=True)
        if getattr(args, flag) is not None
    }
    if keys.get("name") == "sgd" and "momentum" not in keys:
        keys["momentum"] = SGD_MOMENTUM
    steps = getattr(args, "steps", 0)
    try:
        return LocalOptimizer.from_keys(keys).for_run(steps if steps > 0 else None)
    except ValueError as error:
        key, _, reason = str(error).partition(": ")
        flag = OPTIMIZER_KEYS[key].flag if key in OPTIMIZER_KEYS else key
        raise ValueError(f"{flag}: {reason}") from None


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
        "per-sample gradients (or give --dp-epsilon to pick it; default: none, no DP-SGD)",
    )
    group.add_argument(
        "--dp-clip",
        type=float,
        metavar="C",
        help="per-sample gradient L2 norm bound (required with DP-SGD; default: none)",
    )
    group.add_argument(
        "--dp-epsilon",
        type=float,
        metavar="EPS",
        help="target epsilon: training stops before a step would pass it; without --dp-noise "
        "it also picks the noise for --steps steps (default: none, no budget)",
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
    group.add_argument(
        "--dp-seeded",
        action="store_true",
        help="draw the noise and the Poisson batches from --seed, as the simulator does (same "
        "seed, same noise: reproducible runs; anyone who knows the seed can subtract the "
        "noise; default: off, each peer draws a secret key from the OS at start)",
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
        if getattr(args, "dp_seeded", False):
            raise ValueError(
                "--dp-seeded: applies to DP-SGD only; allowed with --dp-clip and --dp-noise "
                "or --dp-epsilon"
            )
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
    peer.add_argument(
        "--advertise",
        metavar="HOST:PORT",
        help="address others should call (default: the listen address and bound port)",
    )
    peer.add_argument("--client-only", action="store_true", help="never listen; needs --join")
    peer.add_argument(
        "--join",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a live peer to join (repeatable; default: none, this peer starts a swarm)",
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
        "messages; sync algorithms only (default: none, an honest peer)",
    )
    peer.add_argument(
        "--fanout",
        type=int,
        default=None,
        help="async: neighbours averaged with per round (default 1, and 2 for a "
        "--client-only peer, which nobody calls); a neighbour that answers busy gives its "
        "place to another, at most 2 a round",
    )
    peer.add_argument(
        "--round-deadline-s",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="sync: how long a round waits for its neighbours' messages (default 5)",
    )
    peer.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds the partition, the initial model, batches, neighbours, dropout (default 0)",
    )
    peer.add_argument(
        "--topology",
        help="neighbours from a graph over --peers-file: "
        + ", ".join(topology_names())
        + " (default: none, random neighbours from the membership view)",
    )
    peer.add_argument(
        "--topology-weights", help="metropolis (default, undirected), max-degree, lazy, uniform"
    )
    peer.add_argument(
        "--peers-file",
        metavar="FILE",
        help="with --topology: every peer's HOST:PORT, one a line (rank r = line r; default: none)",
    )
    peer.add_argument(
        "--rank", type=int, help="with --topology: this peer's line in --peers-file (default: none)"
    )
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
    peer.add_argument(
        "--request-timeout-s",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="total timeout of every call to another peer (default 10)",
    )
    peer.add_argument(
        "--suspect-after",
        type=int,
        default=1,
        help="failed calls in a row before a neighbour is suspected (default 1)",
    )
    peer.add_argument(
        "--evict-after",
        type=int,
        default=3,
        help="failed calls in a row before a neighbour is evicted (default 3)",
    )
    peer.add_argument(
        "--secret-file",
        help="file holding the swarm secret, >= 16 bytes (default: $GOSSIPNET_SECRET; with "
        "neither the swarm is open, with a loud warning)",
    )
    peer.add_argument(
        "--clock-window-s",
        type=int,
        default=60,
        metavar="SECONDS",
        help="accepted clock skew of signed requests (default 60)",
    )
    peer.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="serve and call over TLS with this certificate "
        "(default: none, plain HTTP; needs --tls-key)",
    )
    peer.add_argument(
        "--tls-key", metavar="FILE", help="the private key of --tls-cert (default: none)"
    )
    peer.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="verify other peers' certificates against this CA (default: none, the system's)",
    )
    peer.add_argument(
        "--max-body-factor",
        type=float,
        default=2.0,
        help="a request body may be at most this factor x the model's bytes + 64 KiB (default 2)",
    )
    peer.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="write checkpoints here, for --resume (default: none, no checkpoints)",
    )
    peer.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="steps between checkpoints in --checkpoint-dir; 0 = only at stop (default 0)",
    )
    peer.add_argument(
        "--keep-checkpoints",
        type=int,
        default=3,
        help="newest checkpoints kept in --checkpoint-dir (default 3)",
    )
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
    work.add_argument(
        "--partition",
        default="iid",
        help=PARTITION_HELP,
    )
    work.add_argument(
        "--peers",
        dest="num_peers",
        type=int,
        default=1,
        metavar="N",
        help="peers the data is split among: N shards, this peer trains --peer-index "
        "(default 1; launch's and workloads inspect's --peers)",
    )
    work.add_argument(
        "--num-peers", dest="num_peers", type=int, metavar="N", action=DeprecatedFlag,
        instead="--peers",
    )  # fmt: skip
    work.add_argument(
        "--peer-index", type=int, default=0, help="this peer's shard, 0-based (default 0)"
    )
    work.add_argument(
        "--model", default="mlp", help=f"workloads model spec (default mlp), {USER_CODE}"
    )
    work.add_argument("--batch-size", type=int, default=32, help="samples per step (default 32)")
    add_optimizer_flags(work)
    add_link_flags(parser)
    add_privacy_flags(parser)
    run = parser.add_argument_group("run")
    run.add_argument(
        "--steps", type=int, default=0, help="optimizer steps, 0 = until a signal (default 0)"
    )
    run.add_argument(
        "--slowdown",
        type=float,
        default=1.0,
        metavar="FACTOR",
        help="emulate a straggler (the simulator's stragglers): each local step takes FACTOR "
        "times its compute time, the peer waiting (FACTOR-1) x each step's measured time "
        "while it keeps serving; >= 1 (default 1: not slowed)",
    )
    run.add_argument(
        "--start-at",
        type=float,
        metavar="UNIX_TIME",
        help="wait until this time (seconds since the epoch) before resuming, listening and "
        "joining: launch --crashes starts a crashed peer's process early, so that it is back "
        "at its rejoin time whatever its start-up takes (default: at once)",
    )
    run.add_argument(
        "--status-every", type=int, default=50, help="steps between status lines (default 50)"
    )
    run.add_argument(
        "--address-file",
        metavar="FILE",
        help="write HOST:PORT here once listening, for scripts (default: none)",
    )
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
        help="before training, wait (up to 60 s) until K other peers are alive, so the first "
        "peer does not train alone (default 0: train at once)",
    )
    run.add_argument(
        "--eval-out",
        metavar="FILE",
        help="at the end, write the test metrics of the data set's task as JSON to FILE "
        "(loss; accuracy, bits per byte or mean squared error; default: none)",
    )
    run.add_argument(
        "--eval-every",
        type=int,
        default=0,
        metavar="N",
        help="while training, evaluate on the test split at step 0 and every N steps and "
        "append one JSON line to --eval-log: step, round, the task's test metrics, and "
        "train_s, the seconds since training began less the evaluations' own (the measured "
        "curve of gossipnet sim predict; default 0: only --eval-out's final evaluation)",
    )
    run.add_argument(
        "--eval-log",
        metavar="FILE",
        help="with --eval-every: the JSON-lines file of those evaluations (default: none)",
    )
    run.add_argument(
        "--save-model",
        metavar="FILE",
        help="write the trained model as safetensors + JSON at the end, see docs/models.md "
        "(default: none)",
    )
    run.add_argument(
        "--log-dir",
        metavar="DIR",
        help="training record in DIR: metrics.csv (step, loss, accuracy, bytes, exchanges) "
        "and TensorBoard event files (tensorboard --logdir DIR), a row per status line and "
        "at the end; MLflow too if installed and MLFLOW_TRACKING_URI is set. Needs "
        "pip install 'gossipnet[logging]' (default: none)",
    )
    run.add_argument(
        "--progress",
        choices=("auto", "live", "lines"),
        default="auto",
        help="live: one rich line on stderr; lines: JSON lines on stdout; auto: live on a TTY "
        "(default auto)",
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
