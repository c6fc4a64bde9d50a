"""``gossipnet peer``: run one networked peer that trains a workloads model on its shard.

Every :class:`~peer.node.config.PeerConfig` field has one flag (``round_deadline_s``
-> ``--round-deadline-s``); the workload flags pick the data set, the partition,
this peer's shard and the model. The peer prints one line when it listens
(``peer ID listening on HOST:PORT``); on a terminal a live line (step, loss,
neighbours, bytes/s, drawn by rich on stderr), otherwise a JSON status line on
stdout every ``--status-every`` steps; a final JSON status line always; and it
stops cleanly (final checkpoint with ``--checkpoint-dir``) on SIGTERM or SIGINT
(Ctrl-C). ``--eval-out FILE`` writes the final test loss and accuracy as JSON,
``--save-model FILE`` the trained model (docs/models.md), ``--log-dir DIR`` a training
record (``metrics.csv`` and TensorBoard event files, :mod:`peer.node.logbook`). Logs go to stderr
(``--log-level``, ``--log-json`` for one JSON object per line); an unexpected error is
one line too, with its traceback only under ``--log-level DEBUG``. Exit codes: 0 done or
stopped by a signal, 1 an unexpected error, 2 bad arguments or no ``--join`` address
answered within ``--join-timeout-s``.

Neighbours are drawn at random from the membership view, or with
``--topology NAME --peers-file FILE --rank R`` from a ``topologies`` graph over the
listed peers (FILE: one ``HOST:PORT`` per line, rank r = line r; the peer
listens on its line and mixes with the graph's weights).

Your own code: ``--model mymodel.py:MyNet`` or ``--model mypkg.models:make_net``, and
``--dataset mypkg.data:load`` or ``--dataset data.npz`` (:mod:`workloads.user_code`).

Every user mistake is one line, ``gossipnet peer: error: FLAG: WHAT; allowed: VALUES``, and
exit code 2, found before the data set is loaded or a port is opened (flags, files, user
code, the secret, a port already in use); :mod:`peer.app.usage` holds the format. A
``PeerConfig`` error carries its field, which is named by its flag.

The algorithm settings' flags (``--order``, ``--local-steps``, ``--aggregator``,
``--compressor``, ``--consensus-step``, ...) come from :data:`gossip.settings.SETTINGS`
(docs/settings.md).

Example, two peers on one machine::

    echo "a-long-swarm-secret-of-32-bytes" > swarm.secret
    gossipnet peer --id a --port 7000 --secret-file swarm.secret --num-peers 2 --peer-index 0 &
    gossipnet peer --id b --port 7001 --join 127.0.0.1:7000 --secret-file swarm.secret \\
        --num-peers 2 --peer-index 1 --steps 500

This module is the parser and :func:`main` (flags checked, mapped onto a
``PeerConfig``); :mod:`peer.app.run` builds the peer and runs it, :mod:`peer.app.logs` sets
up logging.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import socket
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any, NoReturn

from gossip.settings import ConfigurationError
from peer.app.logs import configure_logging
from peer.app.run import build_peer, human_bytes, run_peer
from peer.app.usage import (
    OneLineParser,
    UsageError,
    add_setting_flags,
    exit_with,
    flag_namer,
    one_line,
)
from peer.node.config import ALGORITHMS, MODES, PeerConfig
from peer.node.logbook import LogbookError, check_log_dir
from peer.node.topology import read_peer_list, topology_names
from peer.protocol.auth import SECRET_ENV, OpenSwarmWarning, load_secret
from workloads import (
    DataFileError,
    UserCodeError,
    check_dataset_spec,
    check_model_spec,
    check_partition_spec,
)

__all__ = [
    "CONFIG_FIELDS",
    "human_bytes",
    "main",
    "parse_peer_args",
]

DEFAULT_DATASET = "synthetic:num_samples=2000,seed=0"
USER_CODE = "or your own MODULE:FACTORY (mymodel.py:MyNet, mypkg.models:make_net)"


def _parser(prog: str, raise_errors: bool = False) -> OneLineParser:
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
    work.add_argument("--batch-size", type=int, default=32)
    work.add_argument("--lr", type=float, default=0.05)
    work.add_argument("--momentum", type=float, default=0.9)
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
"""PeerConfig fields that :func:`_network` works out from several flags."""
CONFIG_FIELDS = tuple(
    item.name for item in fields(PeerConfig) if item.name not in (*NETWORK_FIELDS, "secret")
)
"""PeerConfig fields set by the flag of the same name (``peer_id`` by ``--id``; the
secret is read from ``--secret-file`` by the peer)."""


def _namer(parser: OneLineParser) -> Callable[[str], str]:
    """Names a PeerConfig field by its flag (``peer_list`` comes from ``--peers-file``)."""
    return flag_namer(parser, peer_list="--peers-file")


def _network(args: argparse.Namespace, parser: OneLineParser) -> dict[str, Any]:
    """host, port, advertise, join and peer_list: from the flags, or from
    ``--peers-file``/``--rank``."""
    network: dict[str, Any] = {
        "host": args.host or "127.0.0.1",
        "port": args.port if args.port is not None else 0,
        "advertise": args.advertise,
        "join": tuple(args.join),
        "peer_list": (),
    }
    if args.peers_file is None:
        if args.topology is not None or args.rank is not None:
            flag = "--topology" if args.topology is not None else "--rank"
            parser.error(
                f"{flag}: needs --peers-file FILE (every peer's HOST:PORT, one a line) and "
                "--topology and --rank together"
            )
        return network
    if args.topology is None:
        parser.error("--peers-file: FILE needs --topology (e.g. --topology ring)")
    if args.rank is None:
        parser.error("--peers-file: FILE needs --rank R (this peer's line, 0-based)")
    try:
        addresses = read_peer_list(args.peers_file)
    except ValueError as error:
        parser.error(str(error))
    if not 0 <= args.rank < len(addresses):
        parser.error(
            f"--rank: must be in [0, {len(addresses)}) for the {len(addresses)} peers in "
            f"{args.peers_file}, got {args.rank}"
        )
    own = addresses[args.rank]
    own_host, _, own_port = own.rpartition(":")
    local = own_host in ("127.0.0.1", "localhost", "[::1]")
    network.update(
        host=args.host or ("127.0.0.1" if local else "0.0.0.0"),
        port=int(own_port) if args.port is None else args.port,
        advertise=args.advertise or own,
        join=tuple(args.join) or tuple(a for a in addresses if a != own),
        peer_list=addresses,
    )
    return network


def _check_numbers(args: argparse.Namespace, parser: OneLineParser) -> None:
    for name in ("steps", "status_every", "batch_size", "num_peers", "wait_for_peers"):
        minimum = 0 if name in ("steps", "wait_for_peers") else 1
        if getattr(args, name) < minimum:
            parser.error(
                f"--{name.replace('_', '-')}: must be >= {minimum}, got {getattr(args, name)}"
            )
    if not 0 <= args.peer_index < args.num_peers:
        parser.error(
            f"--peer-index: must be in [0, --num-peers={args.num_peers}), got {args.peer_index}"
        )


def _check_workload(args: argparse.Namespace, parser: OneLineParser) -> None:
    """The data set, model and partition specs, checked without loading any data: names
    and parameters, files that must exist, user code that must import."""
    for flag, check, spec in (
        ("--dataset", check_dataset_spec, args.dataset),
        ("--model", check_model_spec, args.model),
        ("--partition", check_partition_spec, args.partition),
    ):
        try:
            check(spec)
        except (ValueError, ImportError) as error:
            parser.error(f"{flag}: {error}")


def _check_secret(args: argparse.Namespace, parser: OneLineParser) -> None:
    """The swarm secret is readable and long enough, named by the flag it came from."""
    try:
        load_secret(args.secret_file)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        parser.error(
            f"--secret-file: cannot read {args.secret_file} ({reason}); allowed: a readable "
            "file holding the swarm secret (at least 16 bytes)"
        )
    except ValueError as error:
        reason = str(error).rpartition(": ")[2]
        if args.secret_file is not None:
            parser.error(f"--secret-file: {args.secret_file}: {reason}")
        parser.error(f"{SECRET_ENV}: {reason}")


def parse_peer_args(
    argv: Sequence[str], prog: str = "gossipnet peer", *, raise_errors: bool = False
) -> tuple[argparse.Namespace, PeerConfig]:
    """Parse and check ``gossipnet peer`` flags without starting anything: the flags, the
    ``PeerConfig`` they map onto, the workload specs (user code imported, files present)
    and the secret. A mistake exits with one line and code 2, or, with
    ``raise_errors=True``, raises :class:`~peer.app.usage.UsageError` (``launch`` checks its
    ``--peer-args`` this way before it spawns anyone)."""
    parser = _parser(prog, raise_errors)
    args = parser.parse_args(list(argv))
    network = _network(args, parser)
    try:
        config = PeerConfig(**network, **{name: getattr(args, name) for name in CONFIG_FIELDS})
    except ConfigurationError as error:
        parser.error(error.render(_namer(parser)))
    _check_numbers(args, parser)
    _check_secret(args, parser)
    _check_workload(args, parser)
    if config.log_dir is not None:
        try:
            check_log_dir(config.log_dir)
        except LogbookError as error:
            parser.error(str(error))
    return args, config


def _check_port(config: PeerConfig, parser: OneLineParser) -> None:
    """The listen address is free, checked before any data is loaded (the peer binds it
    again when it starts; a port taken in between is caught there too)."""
    if config.client_only or config.port == 0:
        return
    family = socket.AF_INET6 if ":" in config.host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind((config.host.strip("[]"), config.port))
        except OSError as error:
            _address_error(error, config, parser)


def _address_error(error: OSError, config: PeerConfig, parser: OneLineParser) -> NoReturn:
    if error.errno == errno.EADDRINUSE:
        parser.error(
            f"--port: {config.host}:{config.port} is already in use; allowed: a free port, "
            "or 0 for one the system picks"
        )
    reason = error.strerror or str(error)
    parser.error(f"--host: cannot listen on {config.host}:{config.port} ({reason})")


def main(argv: Sequence[str], prog: str = "gossipnet peer") -> int:
    """Parse ``argv``, check it, build the peer and run it; returns the exit code."""
    args, config = parse_peer_args(argv, prog)
    parser = _parser(prog)
    level = "INFO" if args.verbose else args.log_level
    configure_logging(level, args.log_json)
    if logging.getLogger().isEnabledFor(logging.WARNING):
        # the peer logs the open-swarm warning; its warnings.warn twin would say it twice
        warnings.filterwarnings("ignore", category=OpenSwarmWarning)
    _check_port(config, parser)
    try:
        return _build_and_run(args, config, parser)
    except UsageError as error:
        exit_with(prog, str(error))
    except Exception as error:
        if level == "DEBUG":
            raise
        where = f"{type(error).__name__}: {error}".splitlines()[0]
        print(
            f"{prog}: error: unexpected {where} (run with --log-level DEBUG for the traceback)",
            file=sys.stderr,
        )
        return 1


def _build_and_run(args: argparse.Namespace, config: PeerConfig, parser: OneLineParser) -> int:
    """Build the peer (the data set loaded, the model built) and run it; a mistake found
    on the way is one line naming its flag."""
    try:
        peer, data = build_peer(args, config)
    except UserCodeError as error:
        parser.error(f"--{error.role}: {error}")
    except (DataFileError, ImportError) as error:
        parser.error(f"--dataset: {error}")
    except ConfigurationError as error:
        parser.error(error.render(_namer(parser)))
    except (ValueError, OSError) as error:
        parser.error(str(error))
    try:
        return asyncio.run(run_peer(peer, data, args))
    except LogbookError as error:  # --log-dir changed since it was checked
        parser.error(str(error))
    except OSError as error:
        if error.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
            _address_error(error, config, parser)
        if isinstance(error, ConnectionError):  # could not join (before join retries)
            print(f"{parser.prog}: error: {one_line(str(error))}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
