"""``gossipnet peer``: run one networked peer that trains a workloads model on its shard.

Every :class:`~peer.config.PeerConfig` field has one flag (``round_deadline_s``
-> ``--round-deadline-s``); the workload flags pick the data set, the partition,
this peer's shard and the model. The peer prints one line when it listens
(``peer ID listening on HOST:PORT``); on a terminal a live line (step, loss,
neighbours, bytes/s, drawn by rich on stderr), otherwise a JSON status line on
stdout every ``--status-every`` steps; a final JSON status line always; and it
stops cleanly (final checkpoint with ``--checkpoint-dir``) on SIGTERM or SIGINT
(Ctrl-C). ``--eval-out FILE`` writes the final test loss and accuracy as JSON.
Logs go to stderr (``--log-level``, ``--log-json`` for one JSON object per
line). Exit codes: 0 done or stopped by a signal, 1 could not join the swarm,
2 bad arguments.

Neighbours are drawn at random from the membership view, or with
``--topology NAME --peers FILE --rank R`` from a ``topologies`` graph over the
listed peers (FILE: one ``HOST:PORT`` per line, rank r = line r; the peer
listens on its line and mixes with the graph's weights).

Example, two peers on one machine::

    echo "a-long-swarm-secret-of-32-bytes" > swarm.secret
    gossipnet peer --id a --port 7000 --secret-file swarm.secret --num-peers 2 --peer-index 0 &
    gossipnet peer --id b --port 7001 --join 127.0.0.1:7000 --secret-file swarm.secret \\
        --num-peers 2 --peer-index 1 --steps 500

This module is the parser and :func:`main` (flags checked, mapped onto a
``PeerConfig``); :mod:`peer.run` builds the peer and runs it, :mod:`peer.logs` sets
up logging.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import Sequence
from typing import Any

from gossip.algorithms import ORDERS
from peer.codecs import DENSE_CODECS
from peer.config import ALGORITHMS, MODES, PeerConfig
from peer.logs import configure_logging
from peer.run import build_peer, human_bytes, run_peer
from peer.topology import read_peer_list, topology_names
from peer.usage import OneLineParser

# human_bytes lives in peer.run; peer.status and peer.progress import it from here
__all__ = ["CONFIG_FIELDS", "FLAG_NAMES", "flag_message", "human_bytes", "main"]

DEFAULT_DATASET = "synthetic:num_samples=2000,seed=0"


def _parser(prog: str) -> argparse.ArgumentParser:
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
    peer.add_argument(
        "--order", choices=ORDERS, help="dpsgd: combine-then-adapt (default) or adapt-then-combine"
    )
    peer.add_argument(
        "--local-steps",
        type=int,
        help="optimizer steps per round (dpsgd: default 1; local-sgd: default 4, >= 2)",
    )
    peer.add_argument(
        "--aggregator",
        help="consensus spec, e.g. trimmed-mean:b=1 (default mean); it must be able to run on "
        "the smallest neighbourhood (ad-psgd: the pair's 2 models)",
    )
    peer.add_argument(
        "--compress",
        "--codec",
        dest="codec",
        help="codec of sent models: "
        + ", ".join(DENSE_CODECS)
        + " (e.g. qsgd:bits=8; default none)",
    )
    peer.add_argument(
        "--consensus-step", type=float, help="choco: consensus step gamma in (0, 1] (default 0.5)"
    )
    peer.add_argument(
        "--byzantine",
        metavar="ATTACK",
        help="evaluation only: act as a Byzantine member that sends this consensus attack "
        "(sign-flip, gaussian:sigma=1, alie, ...; see gossipnet consensus) instead of its "
        "messages; sync algorithms only",
    )
    peer.add_argument("--fanout", type=int, default=1, help="async: neighbours per round")
    peer.add_argument("--round-deadline-s", type=float, default=5.0, help="sync: round deadline")
    peer.add_argument("--seed", type=int, default=0)
    peer.add_argument(
        "--topology",
        help="neighbours from a graph over --peers: " + ", ".join(topology_names()),
    )
    peer.add_argument(
        "--topology-weights", help="metropolis (default, undirected), max-degree, lazy, uniform"
    )
    peer.add_argument(
        "--peers",
        dest="peers_file",
        metavar="FILE",
        help="with --topology: every peer's HOST:PORT, one a line (rank r = line r)",
    )
    peer.add_argument("--rank", type=int, help="with --topology: this peer's line in --peers")
    peer.add_argument("--device", default="cpu", help="auto, cpu, cuda or cuda:INDEX (default cpu)")
    peer.add_argument(
        "--max-concurrent-exchanges",
        type=int,
        default=8,
        help="exchanges served at once, more get 409 busy (default 8)",
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
    work = parser.add_argument_group("workload")
    work.add_argument("--dataset", default=DEFAULT_DATASET, help=f"default {DEFAULT_DATASET}")
    work.add_argument("--partition", default="iid", help="iid, dirichlet:alpha=0.5, shards:...")
    work.add_argument("--num-peers", type=int, default=1, help="shards the data is split into")
    work.add_argument("--peer-index", type=int, default=0, help="this peer's shard, 0-based")
    work.add_argument("--model", default="mlp", help="workloads model name (default mlp)")
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
        help="logging to stderr (default WARNING)",
    )
    run.add_argument("--log-json", action="store_true", help="log one JSON object per line")
    run.add_argument("-v", "--verbose", action="store_true", help="same as --log-level INFO")
    return parser


CONFIG_FIELDS = (
    "peer_id", "client_only", "fetch_state", "order", "algorithm",
    "local_steps", "aggregator", "codec", "consensus_step", "byzantine", "fanout", "round_deadline_s", "seed", "topology",
    "topology_weights", "rank", "device", "max_concurrent_exchanges",
    "request_timeout_s", "suspect_after", "evict_after", "secret_file", "clock_window_s",
    "tls_cert", "tls_key", "tls_ca", "max_body_factor", "checkpoint_dir", "checkpoint_every",
    "keep_checkpoints", "resume",
)  # fmt: skip
FLAG_NAMES = {"peer_id": "--id", "codec": "--compress", "peer_list": "--peers"}
"""Config fields whose flag is not ``--`` + the field name with dashes."""


def flag_message(error: Exception) -> str:
    """A ``PeerConfig`` error with each ``PeerConfig.field`` written as its flag."""
    return re.sub(
        r"PeerConfig\.(\w+)",
        lambda m: FLAG_NAMES.get(m[1], "--" + m[1].replace("_", "-")),
        str(error),
    )


def _network(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """host, port, advertise, join and peer_list: from the flags, or from ``--peers``/``--rank``."""
    network: dict[str, Any] = {
        "host": args.host or "127.0.0.1",
        "port": args.port if args.port is not None else 0,
        "advertise": args.advertise,
        "join": tuple(args.join),
        "peer_list": (),
    }
    if args.peers_file is None:
        if args.topology is not None or args.rank is not None:
            parser.error("--topology and --rank need --peers FILE (one HOST:PORT a line)")
        return network
    if args.topology is None:
        parser.error("--peers FILE needs --topology (e.g. --topology ring)")
    if args.rank is None:
        parser.error("--peers FILE needs --rank R (this peer's line, 0-based)")
    try:
        addresses = read_peer_list(args.peers_file)
    except ValueError as error:
        parser.error(str(error))
    if not 0 <= args.rank < len(addresses):
        parser.error(
            f"--rank must be in [0, {len(addresses)}) for the {len(addresses)} peers in "
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


def main(argv: Sequence[str], prog: str = "gossipnet peer") -> int:
    """Parse ``argv``, check it, build the peer and run it; returns the exit code."""
    parser = _parser(prog)
    args = parser.parse_args(list(argv))
    configure_logging("INFO" if args.verbose else args.log_level, args.log_json)
    network = _network(args, parser)
    try:
        config = PeerConfig(
            mode=args.mode,
            **network,
            **{name: getattr(args, name) for name in CONFIG_FIELDS},
        )
    except ValueError as error:
        parser.error(flag_message(error))
    for name in ("steps", "status_every", "batch_size", "num_peers", "wait_for_peers"):
        minimum = 0 if name in ("steps", "wait_for_peers") else 1
        if getattr(args, name) < minimum:
            parser.error(
                f"--{name.replace('_', '-')} must be >= {minimum}, got {getattr(args, name)}"
            )
    if not 0 <= args.peer_index < args.num_peers:
        parser.error(
            f"--peer-index must be in [0, --num-peers={args.num_peers}), got {args.peer_index}"
        )
    try:
        peer, data = build_peer(args, config)
    except (ValueError, OSError) as error:
        parser.error(flag_message(error) if "PeerConfig." in str(error) else str(error))
    try:
        return asyncio.run(run_peer(peer, data, args))
    except ConnectionError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
