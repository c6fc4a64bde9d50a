"""``gossipnet peer``: run one networked peer that trains a workloads model on its shard.

Every :class:`~peer.node.config.PeerConfig` field has one flag (``round_deadline_s``
-> ``--round-deadline-s``); the workload flags pick the data set, the partition,
this peer's shard and the model. The peer prints one line when it listens
(``peer ID listening on HOST:PORT``); on a terminal a live line (step, loss,
neighbours, bytes/s, drawn by rich on stderr), otherwise a JSON status line on
stdout every ``--status-every`` steps; a final JSON status line always; and it
stops cleanly (final checkpoint with ``--checkpoint-dir``) on SIGTERM or SIGINT
(Ctrl-C). ``--eval-out FILE`` writes the final test metrics of the data set's task as JSON,
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
    gossipnet peer --id a --port 7000 --secret-file swarm.secret --peers 2 --peer-index 0 \\
        --wait-for-peers 1 &
    gossipnet peer --id b --port 7001 --join 127.0.0.1:7000 --secret-file swarm.secret \\
        --peers 2 --peer-index 1 --wait-for-peers 1 --steps 500

This module is the parser and :func:`main` (flags checked, mapped onto a
``PeerConfig``); :mod:`peer.app.run` builds the peer and runs it, :mod:`peer.app.logs` sets
up logging.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import math
import socket
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from gossip.settings import ConfigurationError
from peer.app.logs import configure_logging
from peer.app.peer_flags import (
    CONFIG_FIELDS,
    peer_parser,
    privacy_config,
)
from peer.app.run import build_peer, run_peer
from peer.app.status import human_bytes
from peer.app.usage import (
    OneLineParser,
    UsageError,
    exit_with,
    flag_namer,
    one_line,
)
from peer.node.config import PeerConfig
from peer.node.logbook import LogbookError, check_log_dir
from peer.node.topology import read_peer_list
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
    flag = _namer(parser)
    for name in (
        "steps", "status_every", "batch_size", "num_peers", "wait_for_peers", "eval_every"
    ):  # fmt: skip
        minimum = 0 if name in ("steps", "wait_for_peers", "eval_every") else 1
        if getattr(args, name) < minimum:
            parser.error(f"{flag(name)}: must be >= {minimum}, got {getattr(args, name)}")
    if (args.eval_every > 0) != (args.eval_log is not None):
        parser.error(
            "--eval-every: goes with --eval-log FILE (where each evaluation is written); "
            f"got --eval-every {args.eval_every} and --eval-log {args.eval_log}"
        )
    if args.start_at is not None and not (math.isfinite(args.start_at) and args.start_at >= 0):
        parser.error(f"--start-at: must be a Unix time in seconds >= 0, got {args.start_at}")
    if not 0 <= args.peer_index < args.num_peers:
        parser.error(
            f"--peer-index: must be in [0, --peers={args.num_peers}), got {args.peer_index}"
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
    parser = peer_parser(prog, raise_errors)
    args = parser.parse_args(list(argv))
    network = _network(args, parser)
    try:
        config = PeerConfig(**network, **{name: getattr(args, name) for name in CONFIG_FIELDS})
    except ConfigurationError as error:
        parser.error(error.render(_namer(parser)))
    _check_numbers(args, parser)
    try:
        privacy_config(args)
    except ValueError as error:
        parser.error(str(error))
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
    parser = peer_parser(prog)
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
