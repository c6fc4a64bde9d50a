"""One push-pull exchange between two peers over loopback, beside torch.distributed (gloo).

For each model size, in the same run, each configuration in fresh processes:

* ``signed``: one ``Peer.gossip()`` (async mode, codec ``none``) from a caller process to a
  callee process: snapshot into the reused send buffer, the envelope streamed from it with
  its Poly1305 tag computed as it goes (stream-signed ``POST /v1/exchange``), read into a
  reused buffer and authenticated on the callee, atomic averaging, the answer streamed back
  signed, authenticated, validated and mixed on the caller. The model's bytes cross the
  loopback twice (there and back).
* ``open``: the same without a swarm secret.
* ``TLS``: ``open`` over TLS (a self-signed certificate made with ``cryptography``): the
  cost of encryption on the same path.
* ``gloo``: ``dist.send`` then ``dist.recv`` of the same bytes between two processes
  (``init_method=tcp://127.0.0.1:PORT``): the bytes moved both ways, with no framing,
  validation or mixing. This is the reference. It runs before and after the peer's columns
  and its median is over both runs (background load that comes and goes weighs on both).

MB/s counts both directions (2 x model bytes per exchange). ``x gloo`` = time / gloo's time.
``--device cuda``: both peers' models on the GPU (each exchange stages through the peer's
pinned host buffers); gloo still moves host tensors, the loopback's reference.
``CPU ms``: processor time per exchange (user + system, both processes together) over the
timed exchanges: on a machine with few cores, the time of an exchange cannot fall below
this over the number of cores, whatever overlaps.
Median of ``--repeats`` after one warm-up. RSS, in copies of the model, for the caller and
the callee process: ``held+peak``, what the process holds once its peer started (beyond its
imports) and the peak growth beyond that while exchanging (the kernel's VmHWM, reset at
start); docs/protocol.md, "Memory", states the counts. ``--phases`` adds a table of the
mean of each phase of an exchange as the two peers time it
(``gossipnet_exchange_phase_seconds``: the caller's round trip and adoption, the callee's
receive, check and answer). Run::

    .venv/bin/python bench/exchange.py               # 1, 4, 16, 64, 256 MB
    .venv/bin/python bench/exchange.py --sizes 16,64 --repeats 7
    .venv/bin/python bench/exchange.py --sizes 64 --phases   # + where the time goes
    .venv/bin/python bench/exchange.py --device cuda   # on a machine with a GPU
    .venv/bin/python bench/exchange.py --sizes 16,64 --repeats 7 --rounds 2 --ablate

``--ablate``: what each fast path of the ``signed`` exchange buys. Per size, ``--rounds``
times: the full path, then each path in :data:`PATHS` turned off alone (its documented
switch, whose "off" form is the plain path); then the full path once more; each run in
fresh processes, each configuration's times pooled over its runs (load that comes and goes
weighs on all). Every configuration must leave the two models bit-identical, and the
same bits as the full path (a RuntimeError otherwise). The table gives, per path, the
median exchange time with it on and off, their ratio, the spread of each (IQR and
min-max over the timed exchanges), the processor time per exchange of both processes
(``CPU``: the median over the configuration's runs), the 1-minute load averages as its
runs started, and a verdict: ``pays`` where off is slower than on by more than the larger IQR,
``costs`` where on is slower by more than that, ``noise`` otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import ipaddress
import logging
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
import warnings
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from peer.node.metrics import EXCHANGE_PHASES
from workloads.device import resolve_device

SECRET = b"bench-swarm-secret-0123456789"

PATHS = {
    "stream_answer": "callee's average sent while computed by chunk "
    "(PairwiseExchange.stream_answer)",
    "direct_reads": "bodies read with recv_into, both sides (socket_reads.DIRECT_READS)",
    "stream_signed": "Poly1305 tags as the bytes go, vs SHA-256 digests (PeerClient.stream_signed)",
}
"""The fast paths ``--ablate`` turns off one at a time, and what each does (its switch)."""


class FlatModel(torch.nn.Module):
    """A model that is just ``numel`` float32 parameters."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(numel))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight.sum()


def _peer(
    peer_id: str, numel: int, secret: bytes | None, off: tuple[str, ...] = (), **config: Any
) -> Any:
    """A peer of the bench, with the fast paths named in ``off`` (:data:`PATHS`) turned off
    through their public switches (the client's are set by :func:`_client_paths` once it is
    made)."""
    from peer.node.config import PeerConfig
    from peer.node.pairwise import PairwiseExchange
    from peer.node.peer import Peer
    from peer.transport import socket_reads

    unknown = set(off) - PATHS.keys()
    if unknown:
        raise ValueError(f"unknown fast paths {sorted(unknown)}; known: {list(PATHS)}")
    socket_reads.DIRECT_READS = "direct_reads" not in off  # the apps and clients made next
    # a model of its own per peer id ("caller" and "callee" have the same length, so a seed
    # from the length gave them one model, and the bit check could not see a wrong average)
    torch.manual_seed(int.from_bytes(hashlib.sha256(peer_id.encode()).digest()[:4], "little"))
    peer = Peer(
        FlatModel(numel),
        lambda params: torch.optim.SGD(params, lr=0.0),
        torch.nn.functional.mse_loss,
        [],
        PeerConfig(peer_id=peer_id, secret=secret, request_timeout_s=300.0, **config),
    )
    mode = peer.mode
    assert isinstance(mode, PairwiseExchange)
    mode.stream_answer = "stream_answer" not in off
    if "stream_signed" in off:  # the callee admits a digest-signed model (read before checked)
        peer.handlers.max_unauthenticated_bytes = max(8 << 20, 2 * numel * 4 + (1 << 20))
    return peer


def _client_paths(peer: Any, off: tuple[str, ...]) -> None:
    """The client's switches, once ``peer.start()`` made it."""
    peer.client.stream_signed = "stream_signed" not in off


def _digest(peer: Any) -> str:
    """SHA-256 of the peer's model bytes (copied to the host first if it is on a GPU)."""
    return hashlib.sha256(peer.flat.vector.detach().cpu().numpy().tobytes()).hexdigest()


def _quiet() -> None:
    """The open-swarm warning is expected here (the 'open' column)."""
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    logging.getLogger("peer").setLevel(logging.ERROR)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def _reset_peak() -> None:
    """Restart the kernel's peak-RSS counter (VmHWM) at the current RSS."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _memory(baseline: int) -> tuple[int, int]:
    """(bytes held once the peer started, peak bytes beyond that while exchanging)."""
    started = _rss_bytes()
    _reset_peak()
    return started - baseline, started


def _serve(
    numel: int,
    secret: bytes | None,
    tls: dict[str, str],
    off: tuple[str, ...],
    queue: Queue[Any],
    stop: Event,
    timing: tuple[Event, Event],
) -> None:
    _quiet()
    import peer.node.peer  # noqa: F401  (imports before the baseline)

    baseline = _rss_bytes()

    async def main() -> None:
        peer = _peer("callee", numel, secret, off, **tls)
        await peer.start()
        _client_paths(peer, off)
        held, started = _memory(baseline)
        queue.put(peer.address)
        await asyncio.to_thread(timing[0].wait)  # after the caller's warm-up exchange
        # the warm-up is timed once its answer is written (or never, if it failed)
        while peer.metrics.phase_totals()["callee", "answer"][1] < 1 and not stop.is_set():
            await asyncio.sleep(0.001)
        cpu = _cpu_seconds()
        phases = peer.metrics.phase_totals()
        await asyncio.to_thread(timing[1].wait)  # the timed exchanges are done
        cpu = _cpu_seconds() - cpu
        while not stop.is_set():
            await asyncio.sleep(0.05)
        phases = _phase_means(phases, peer.metrics.phase_totals())
        peak = _peak_rss_bytes() - started
        digest = _digest(peer)
        await peer.stop()
        queue.put((held, peak, digest, cpu, phases))

    asyncio.run(main())


def _call(
    numel: int,
    secret: bytes | None,
    tls: dict[str, str],
    off: tuple[str, ...],
    address: str,
    repeats: int,
    queue: Queue[Any],
    timing: tuple[Event, Event],
) -> None:
    _quiet()
    import peer.node.peer  # noqa: F401

    baseline = _rss_bytes()
    memory = (0, 0)
    peak: list[int] = []
    digests: list[str] = []
    cpu: list[float] = []
    phases: list[Any] = []

    async def main() -> list[float]:
        caller = _peer(
            "caller",
            numel,
            secret,
            off,
            client_only=True,
            join=(address,),
            fetch_state=False,
            **tls,
        )
        await caller.start()
        _client_paths(caller, off)
        nonlocal memory
        memory = _memory(baseline)
        times = []
        try:
            for i in range(repeats + 1):
                if i == 1:  # after the warm-up: both sides count processor time
                    timing[0].set()
                    cpu.append(_cpu_seconds())
                    phases.append(caller.metrics.phase_totals())
                started = time.perf_counter()
                if await caller.gossip() != 1:
                    raise RuntimeError("exchange failed")
                times.append(time.perf_counter() - started)
            cpu[0] = _cpu_seconds() - cpu[0]
            phases[0] = _phase_means(phases[0], caller.metrics.phase_totals())
            peak.append(_peak_rss_bytes() - memory[1])
            digests.append(_digest(caller))
        finally:
            for event in timing:  # the callee stops counting (also when an exchange failed)
                event.set()
            await caller.stop()
        return times[1:]

    times = asyncio.run(main())
    queue.put((times, (memory[0], peak[0]), digests[0], cpu[0], phases[0]))


def _phase_means(
    before: dict[tuple[str, str], tuple[float, int]],
    after: dict[tuple[str, str], tuple[float, int]],
) -> dict[tuple[str, str], float]:
    """Mean seconds of each phase observed between two readings of
    ``PeerMetrics.phase_totals`` (the phases this side timed)."""
    means = {}
    for key, (seconds, count) in after.items():
        earlier_seconds, earlier_count = before.get(key, (0.0, 0))
        if count > earlier_count:
            means[key] = (seconds - earlier_seconds) / (count - earlier_count)
    return means


class PeerRun:
    """One configuration timed in fresh processes (:func:`time_peer`)."""

    def __init__(
        self,
        times: list[float],
        caller_rss: tuple[int, int],
        callee_rss: tuple[int, int],
        cpu: float,
        phases: dict[tuple[str, str], float],
        digest: str,
    ) -> None:
        self.times = times
        """Seconds of each timed exchange (the warm-up left out)."""
        self.caller_rss = caller_rss
        """The caller's (held once started, peak growth while exchanging) resident bytes."""
        self.callee_rss = callee_rss
        """The callee's, as :attr:`caller_rss`."""
        self.cpu = cpu
        """Processor seconds per exchange, both processes together."""
        self.phases = phases
        """Mean seconds of each phase (``gossipnet_exchange_phase_seconds``)."""
        self.digest = digest
        """SHA-256 of the model both peers hold at the end."""

    @property
    def seconds(self) -> float:
        """The median exchange."""
        return statistics.median(self.times)


def time_peer(
    numel: int,
    secret: bytes | None,
    repeats: int,
    tls: dict[str, str],
    off: tuple[str, ...] = (),
) -> PeerRun:
    """``repeats`` exchanges after a warm-up, from a fresh caller process to a fresh callee
    process, with the fast paths in ``off`` (:data:`PATHS`) turned off on both. Raises
    unless both models are bit-identical after the exchanges (with lr = 0 both hold the
    pair's average)."""
    context = mp.get_context("spawn")
    queue: Queue[Any] = context.Queue()
    stop, timing = context.Event(), (context.Event(), context.Event())
    server = context.Process(target=_serve, args=(numel, secret, tls, off, queue, stop, timing))
    server.start()
    try:
        address = queue.get(timeout=300)
        results: Queue[Any] = context.Queue()
        caller = context.Process(
            target=_call, args=(numel, secret, tls, off, address, repeats, results, timing)
        )
        caller.start()
        times, caller_rss, caller_digest, caller_cpu, caller_phases = results.get(timeout=1800)
        caller.join(timeout=60)
        stop.set()
        held, peak, callee_digest, callee_cpu, callee_phases = queue.get(timeout=120)
        if caller_digest != callee_digest:  # lr = 0: both must hold the pair's average
            raise RuntimeError(
                f"after the exchanges the two models differ (off: {', '.join(off) or 'none'})"
            )
        cpu = (caller_cpu + callee_cpu) / repeats
        phases = {**caller_phases, **callee_phases}
        return PeerRun(times, caller_rss, (held, peak), cpu, phases, caller_digest)
    finally:
        stop.set()
        server.join(timeout=60)


def make_certificate(directory: Path) -> dict[str, str]:
    """A self-signed certificate for 127.0.0.1 (its own CA), made with ``cryptography``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert, key_file = directory / "cert.pem", directory / "key.pem"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return {"tls_cert": str(cert), "tls_key": str(key_file), "tls_ca": str(cert)}


def _gloo(rank: int, port: int, numel: int, repeats: int, queue: Queue[Any]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    mine, theirs = torch.randn(numel), torch.empty(numel)
    dist.barrier()
    times = []
    cpu = 0.0
    for i in range(repeats + 1):
        if i == 1:
            cpu = _cpu_seconds()
        started = time.perf_counter()
        if rank == 0:
            dist.send(mine, 1)
            dist.recv(theirs, 1)
        else:
            dist.recv(theirs, 0)
            dist.send(mine, 0)
        times.append(time.perf_counter() - started)
    cpu = _cpu_seconds() - cpu
    queue.put((rank, times[1:], cpu))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def time_gloo(numel: int, repeats: int) -> tuple[list[float], float]:
    """(rank 0's seconds per send-recv pair, processor seconds per pair of both)."""
    context = mp.get_context("spawn")
    queue: Queue[Any] = context.Queue()
    port = _free_port()
    workers = [context.Process(target=_gloo, args=(r, port, numel, repeats, queue)) for r in (0, 1)]
    for w in workers:
        w.start()
    results = sorted(queue.get(timeout=300) for _ in workers)
    for w in workers:
        w.join(timeout=30)
    return results[0][1], sum(cpu for _, _, cpu in results) / repeats


def _device_name(device: str) -> str:
    if device == "cpu":
        return "models on cpu"
    return f"models on {device} ({torch.cuda.get_device_name(torch.device(device))})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/exchange.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", default="1,4,16,64,256", help="model sizes in MB (float32), comma-separated"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed exchanges per size (median)")
    parser.add_argument("--no-tls", action="store_true", help="leave out the TLS column")
    parser.add_argument(
        "--phases",
        action="store_true",
        help="after the table, where each configuration's time goes: the mean of each phase "
        "of an exchange as the two peers time it (gossipnet_exchange_phase_seconds)",
    )
    parser.add_argument(
        "--ablate",
        action="store_true",
        help="instead of the table, the signed exchange with all its fast paths, then with "
        f"each turned off alone ({', '.join(PATHS)}): medians, spread and ratio",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with --ablate: how many times each configuration runs, interleaved (default 1)",
    )
    parser.add_argument(
        "--paths",
        default=",".join(PATHS),
        help="with --ablate: the fast paths to turn off (one at a time), comma-separated "
        "(default: all)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="where both peers' models live: cpu (default), auto, cuda or cuda:I (gloo's reference "
        "moves host tensors either way)",
    )
    args = parser.parse_args(argv)
    _quiet()
    try:
        sizes = [float(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes must be comma-separated numbers of MB, got {args.sizes!r}")
    if any(s <= 0 for s in sizes):
        parser.error("--sizes must all be > 0")
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    try:  # the one device parser of both runners, checked before anything starts
        device = str(resolve_device(args.device))
    except ValueError as error:
        parser.error(f"--device: {error}")
    paths = [p for p in args.paths.split(",") if p]
    unknown = [p for p in paths if p not in PATHS]
    if unknown or not paths:
        parser.error(
            f"--paths must be comma-separated names among {', '.join(PATHS)}, got {args.paths!r}"
        )
    if args.ablate:
        if device != "cpu":
            parser.error("--ablate: the fast paths it times are those of models on the cpu")
        ablate(sizes, args.repeats, paths, args.rounds)
        return 0
    columns = ["signed", "open"] + ([] if args.no_tls else ["TLS"])
    print(
        f"# bench/exchange.py, {datetime.date.today()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, {_device_name(device)}, median of {args.repeats}; "
        "RSS in model copies, "
        "caller/callee, each held+peak: resident once started + peak growth while exchanging"
    )
    header = f"{'MB':>5}  {'gloo ms':>8}  {'MB/s':>6}  {'CPU ms':>6}"
    for column in columns:
        header += f"  {column + ' ms':>10}  {'MB/s':>6}  {'x gloo':>6}  {'CPU ms':>6}  {'RSS':>15}"
    print(header)
    print("-" * len(header))
    timed: list[tuple[float, str, float, dict[tuple[str, str], float]]] = []
    with tempfile.TemporaryDirectory() as directory:
        tls = make_certificate(Path(directory)) if not args.no_tls else {}
        on = {"device": device}
        settings = {"signed": (SECRET, on), "open": (None, on), "TLS": (None, {**tls, **on})}
        for size in sizes:
            numel = int(size * 2**20) // 4
            model_bytes = numel * 4
            moved = 2 * model_bytes / 2**20
            first, first_cpu = time_gloo(numel, args.repeats)
            rows = []
            for column in columns:
                secret, extra = settings[column]
                run = time_peer(numel, secret, args.repeats, extra)
                timed.append((size, column, run.seconds, run.phases))
                copies = "/".join(
                    f"{held / model_bytes:.1f}+{peak / model_bytes:.1f}"
                    for held, peak in (run.caller_rss, run.callee_rss)
                )
                rows.append((run.seconds, run.cpu, copies))
            # gloo again after the peer's columns: its median is over both runs
            second, second_cpu = time_gloo(numel, args.repeats)
            gloo = statistics.median(first + second)
            gloo_cpu = (first_cpu + second_cpu) / 2
            line = f"{size:>5g}  {gloo * 1e3:>8.1f}  {moved / gloo:>6.0f}  {gloo_cpu * 1e3:>6.1f}"
            for seconds, cpu, copies in rows:
                line += (
                    f"  {seconds * 1e3:>10.1f}  {moved / seconds:>6.0f}  "
                    f"{seconds / gloo:>6.2f}  {cpu * 1e3:>6.1f}  {copies:>15}"
                )
            print(line, flush=True)
    if args.phases:
        print_phases(timed)
    return 0


def _spread(times: list[float]) -> tuple[float, float, float, float]:
    """(median, IQR, min, max) of ``times``, in ms."""
    ms = sorted(t * 1e3 for t in times)
    if len(ms) >= 2:
        quartiles = statistics.quantiles(ms, n=4, method="inclusive")
        iqr = quartiles[2] - quartiles[0]
    else:
        iqr = 0.0
    return statistics.median(ms), iqr, ms[0], ms[-1]


def verdict(on: list[float], off: list[float]) -> str:
    """``pays`` where the path's median (``on``) is below the plain path's (``off``) by more
    than the larger of the two IQRs, ``costs`` where it is above by more, else ``noise``."""
    on_median, on_iqr, _, _ = _spread(on)
    off_median, off_iqr, _, _ = _spread(off)
    margin = max(on_iqr, off_iqr)
    if off_median - on_median > margin:
        return "pays"
    if on_median - off_median > margin:
        return "costs"
    return "noise"


def ablate(sizes: list[float], repeats: int, paths: list[str], rounds: int = 1) -> None:
    """The ``--ablate`` table (see the module's docstring) for ``paths`` (of :data:`PATHS`):
    ``rounds`` times the full path then each path off, then the full path once more; each
    configuration's times (and load averages) pooled over its runs."""
    print(
        f"# bench/exchange.py --ablate, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} "
        f"UTC, {os.cpu_count()} cores, torch {torch.__version__}, signed exchange; "
        f"{rounds} round(s) of: the full path, then each path off; then the full path again; "
        f"{repeats} timed exchanges per run; ms; load = 1-min load averages as the runs "
        "started (min-max)"
    )
    header = (
        f"{'MB':>5}  {'path turned off':<16}  {'on ms':>7}  {'IQR':>6}  {'min-max':>13}  "
        f"{'off ms':>7}  {'IQR':>6}  {'min-max':>13}  {'off/on':>6}  {'CPU on':>6}  "
        f"{'CPU off':>7}  {'load on':>9}  {'load off':>9}  verdict"
    )
    print(header)
    print("-" * len(header))
    for size in sizes:
        numel = int(size * 2**20) // 4
        times: dict[str, list[float]] = {}
        loads: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        digests = set()
        for name in ["", *paths] * rounds + [""]:
            loads.setdefault(name, []).append(os.getloadavg()[0])
            off = (name,) if name else ()
            run = time_peer(numel, SECRET, repeats, {}, off)
            times.setdefault(name, []).extend(run.times)
            cpu.setdefault(name, []).append(run.cpu * 1e3)
            digests.add(run.digest)
        if len(digests) != 1:
            raise RuntimeError(f"{size:g} MB: the configurations end with different models")
        on = times[""]
        on_median, on_iqr, on_min, on_max = _spread(on)
        on_load = f"{min(loads['']):.1f}-{max(loads['']):.1f}"
        on_cpu = statistics.median(cpu[""])
        for name in paths:
            off = times[name]
            off_median, off_iqr, off_min, off_max = _spread(off)
            off_load = f"{min(loads[name]):.1f}-{max(loads[name]):.1f}"
            print(
                f"{size:>5g}  {name:<16}  {on_median:>7.1f}  {on_iqr:>6.1f}  "
                f"{f'{on_min:.1f}-{on_max:.1f}':>13}  {off_median:>7.1f}  {off_iqr:>6.1f}  "
                f"{f'{off_min:.1f}-{off_max:.1f}':>13}  {off_median / on_median:>6.2f}  "
                f"{on_cpu:>6.1f}  {statistics.median(cpu[name]):>7.1f}  "
                f"{on_load:>9}  {off_load:>9}  {verdict(on, off)}",
                flush=True,
            )


def print_phases(timed: list[tuple[float, str, float, dict[tuple[str, str], float]]]) -> None:
    """The mean of each phase of an exchange (ms), per size and configuration: the caller's
    round trip holds the callee's three phases and the loopback's share; then the caller
    adopts the answer."""
    print(
        "\n# where the time goes: mean ms of each phase (gossipnet_exchange_phase_seconds); "
        "caller round_trip = callee receive + check + answer + the rest of the round trip"
    )
    names = [f"{role} {phase}" for role, phase in EXCHANGE_PHASES]
    header = f"{'MB':>5}  {'config':>6}  {'median':>7}" + "".join(f"  {n:>17}" for n in names)
    print(header)
    print("-" * len(header))
    for size, column, seconds, phases in timed:
        line = f"{size:>5g}  {column:>6}  {seconds * 1e3:>7.1f}"
        for key in EXCHANGE_PHASES:
            line += f"  {phases[key] * 1e3:>17.1f}" if key in phases else f"  {'-':>17}"
        print(line)


if __name__ == "__main__":
    sys.exit(main())
