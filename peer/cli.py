"""``gossipnet peer``: run one networked peer that trains a workloads model on its shard.

Every :class:`~peer.config.PeerConfig` field has one flag (``round_deadline_s``
-> ``--round-deadline-s``); the workload flags pick the data set, the partition,
this peer's shard and the model. The peer prints one line when it listens
(``peer ID listening on HOST:PORT``), a JSON status line every
``--status-every`` steps and at the end, and stops cleanly (final checkpoint
with ``--checkpoint-dir``) on SIGTERM or SIGINT. Exit codes: 0 done or
stopped by a signal, 1 could not join the swarm, 2 bad arguments.

Example, two peers on one machine::

    echo "a-long-swarm-secret-of-32-bytes" > swarm.secret
    gossipnet peer --id a --port 7000 --secret-file swarm.secret --num-peers 2 --peer-index 0 &
    gossipnet peer --id b --port 7001 --join 127.0.0.1:7000 --secret-file swarm.secret \\
        --num-peers 2 --peer-index 1 --steps 500
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from peer.codecs import DENSE_CODECS
from peer.config import MODES, ORDERS, PeerConfig
from peer.node import Peer
from workloads import build_model, load_dataset, partition, peer_batches

DEFAULT_DATASET = "synthetic:num_samples=2000,seed=0"


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    peer.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    peer.add_argument("--port", type=int, default=0, help="listen port, 0 = ephemeral (default)")
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
    peer.add_argument("--mode", choices=MODES, default="async", help="default async")
    peer.add_argument("--order", choices=ORDERS, default="combine-then-adapt")
    peer.add_argument("--local-steps", type=int, default=1, help="optimizer steps per round")
    peer.add_argument("--aggregator", default="mean", help="consensus spec, e.g. trimmed-mean:b=1")
    peer.add_argument("--codec", default="none", help="one of " + ", ".join(DENSE_CODECS))
    peer.add_argument("--fanout", type=int, default=1, help="async: neighbours per round")
    peer.add_argument("--round-deadline-s", type=float, default=5.0, help="sync: round deadline")
    peer.add_argument("--seed", type=int, default=0)
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
    run.add_argument("-v", "--verbose", action="store_true", help="log protocol events")
    return parser


CONFIG_FIELDS = (
    "peer_id", "host", "port", "advertise", "client_only", "fetch_state", "mode", "order",
    "local_steps", "aggregator", "codec", "fanout", "round_deadline_s", "seed",
    "request_timeout_s", "suspect_after", "evict_after", "secret_file", "clock_window_s",
    "tls_cert", "tls_key", "tls_ca", "max_body_factor", "checkpoint_dir", "checkpoint_every",
    "keep_checkpoints", "resume",
)  # fmt: skip


def main(argv: Sequence[str], prog: str = "gossipnet peer") -> int:
    parser = _parser(prog)
    args = parser.parse_args(list(argv))
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        config = PeerConfig(
            join=tuple(args.join), **{name: getattr(args, name) for name in CONFIG_FIELDS}
        )
    except ValueError as error:
        parser.error(str(error).removeprefix("PeerConfig."))
    for name in ("steps", "status_every", "batch_size", "num_peers"):
        minimum = 0 if name == "steps" else 1
        if getattr(args, name) < minimum:
            parser.error(
                f"--{name.replace('_', '-')} must be >= {minimum}, got {getattr(args, name)}"
            )
    if not 0 <= args.peer_index < args.num_peers:
        parser.error(
            f"--peer-index must be in [0, --num-peers={args.num_peers}), got {args.peer_index}"
        )
    try:
        peer = _build_peer(args, config)
    except (ValueError, OSError) as error:
        parser.error(str(error))
    try:
        return asyncio.run(_run(peer, args))
    except ConnectionError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1


def _build_peer(args: argparse.Namespace, config: PeerConfig) -> Peer:
    torch.set_num_threads(1)
    data = load_dataset(args.dataset)
    shards = partition(args.partition, data.y_train, num_peers=args.num_peers, seed=args.seed)
    model = build_model(args.model, data.input_shape, data.num_classes, seed=args.seed)
    lr, momentum = args.lr, args.momentum

    def optimizer(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=lr, momentum=momentum)

    batches = peer_batches(
        data,
        shards[args.peer_index],
        batch_size=args.batch_size,
        seed=args.seed,
        peer=args.peer_index,
    )
    return Peer(model, optimizer, torch.nn.functional.cross_entropy, batches, config)


async def _run(peer: Peer, args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await peer.start()
    try:
        where = peer.address or "(client-only)"
        print(f"peer {peer.peer_id} listening on {where}", flush=True)
        if peer.resumed_from is not None:
            print(f"resumed from {peer.resumed_from} at step {peer.step}", flush=True)
        if args.address_file and peer.address:
            temp = Path(args.address_file + ".tmp")
            temp.write_text(peer.address)
            temp.replace(args.address_file)
        target = peer.step + args.steps if args.steps else None
        stopping = asyncio.ensure_future(stop.wait())
        while target is None or peer.step < target:
            chunk = (
                args.status_every if target is None else min(args.status_every, target - peer.step)
            )
            training = asyncio.ensure_future(peer.run(steps=chunk))
            await asyncio.wait({training, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                training.cancel()
                await asyncio.gather(training, return_exceptions=True)
                break
            training.result()
            print(json.dumps(_status_line(peer)), flush=True)
        stopping.cancel()
    finally:
        await peer.stop()
    print(json.dumps({**_status_line(peer), "stopped": True}), flush=True)
    return 0


def _status_line(peer: Peer) -> dict[str, object]:
    status = peer.status()
    return {
        key: status[key] for key in ("id", "round", "step", "loss", "bytes_in", "bytes_out")
    } | {"neighbours": [m["id"] for m in status["neighbours"] if m["status"] != "evicted"]}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
