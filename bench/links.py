"""Emulated links against their model: exchanges between two real peers on 127.0.0.1 whose
uplinks are shaped (``--latency``, ``--bandwidth``: ``peer.transport.shaping``), beside the time
the simulator charges the same exchange.

An async exchange carries the caller's model there and the callee's back, each on its
sender's uplink, so the wire's share is ``2 (α + M/B)``; the stack adds ``2 (σ + M/S)``
(``gossipnet sim calibrate`` measures σ and S, on the loopback row of this table). Per size
and regime: the median of ``--repeats`` exchanges after one untimed, the wire's
``2 (α + M/B)``, the model with the stack's terms, and the error of that model. Run::

    .venv/bin/python bench/links.py                       # 40 kB, 400 kB, 4 MB
    .venv/bin/python bench/links.py --sizes 4MB --repeats 7

The table goes to docs/calibration.md.
"""

from __future__ import annotations

import argparse
import datetime
import os

from peer.app.calibration import fit_stack, model_sizes, time_exchanges

REGIMES = {
    "loopback": {},
    "50 ms, 100 Mbit/s": {"latency": 0.05, "bandwidth": 1.25e7},
    "10 ms, 1 Gbit/s": {"latency": 0.01, "bandwidth": 1.25e8},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/links.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="40kB,400kB,4MB", help="model sizes (kB, MB)")
    parser.add_argument("--repeats", type=int, default=5, help="timed exchanges per size")
    args = parser.parse_args(argv)
    sizes = model_sizes(args.sizes)
    loopback = time_exchanges(sizes, repeats=args.repeats)
    fit = fit_stack(loopback)
    sigma, stack = fit.stack_latency, fit.stack_bandwidth
    print(
        f"# bench/links.py, {datetime.date.today()}, {os.cpu_count()} cores, median of "
        f"{args.repeats}; stack fitted on loopback: sigma {sigma * 1e3:.3g} ms, "
        f"S {(stack or float('inf')) / 1e6:.4g} MB/s"
    )
    print("| regime | body bytes | measured ms | wire 2(α+M/B) ms | + stack ms | error |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, link in REGIMES.items():
        timings = loopback if not link else time_exchanges(sizes, repeats=args.repeats, link=link)
        for timing in timings:
            m = timing.body_bytes
            wire = 2 * (link.get("latency", 0.0) + m / link.get("bandwidth", float("inf")))
            model = wire + 2 * (sigma + (m / stack if stack else 0.0))
            error = (model - timing.median) / timing.median
            print(
                f"| {name} | {m} | {timing.median * 1e3:.1f} | {wire * 1e3:.1f} | "
                f"{model * 1e3:.1f} | {error:+.0%} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
