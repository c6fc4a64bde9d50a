"""Draw docs/low-communication.md's figure of DiLoCo's ordering (a) over a long run: outer
Nesterov against plain averaging at H = 10, 50 and 200 (docs/low-communication.md, "Over a
longer run").

    gossipnet sim compare examples/experiments/lm-outer-momentum-long.toml --jobs 2 \\
        --jsonl long.jsonl
    gossipnet sim run dp.toml --jsonl dp.jsonl       # optional: data parallel, same tokens
    python examples/outer_momentum_figure.py long.jsonl --data-parallel dp.jsonl \\
        --out docs/figures/lm-outer-momentum-long.png

Left: validation bits per byte of the peers' average model against inner steps per peer.
Right: Nesterov's lead (plain averaging's bits per byte less Nesterov's, at the same H and
the same evaluation) against inner steps per peer: above zero, outer Nesterov is ahead.
Every value drawn is a record of the runs given; nothing is smoothed or interpolated.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Sequence
from pathlib import Path

Curve = list[tuple[float, float]]  # (inner steps per peer, validation bits per byte)

PEERS = 8
TITLE = "DiLoCo's ordering (a): 8 peers, gpt 34,688 parameters, inner AdamW lr 3e-4, iid"
H_VALUES = (10, 50, 200)


def read_records(path: Path) -> dict[str, list[dict[str, object]]]:
    """Each run's records (JSON lines of ``sim compare``/``sim run --jsonl``, or their CSV),
    by run label."""
    runs: dict[str, list[dict[str, object]]] = {}
    if path.suffix == ".csv":
        with path.open(encoding="utf-8") as handle:
            rows: list[dict[str, object]] = list(csv.DictReader(handle))
    else:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    for row in rows:
        runs.setdefault(str(row.get("run", "")), []).append(row)  # sim run: one, unnamed
    return runs


def curve(records: Sequence[dict[str, object]], peers: int) -> Curve:
    """(inner steps per peer, validation bits per byte) of each evaluated record."""
    points = []
    for record in records:
        bits = record.get("test_bits_per_byte")
        if bits in (None, ""):
            continue
        points.append((float(record["steps"]) / peers, float(bits)))  # type: ignore[arg-type]
    return sorted(points)


def lead(nesterov: Curve, averaging: Curve) -> Curve:
    """Averaging's bits per byte less Nesterov's, at the evaluations both have."""
    theirs = dict(averaging)
    return [(step, theirs[step] - bits) for step, bits in nesterov if step in theirs and step > 0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", type=Path, help="the compare's --jsonl (or --csv) file")
    parser.add_argument("--data-parallel", type=Path, help="a data-parallel run's records")
    parser.add_argument("--peers", type=int, default=PEERS, help=f"peers (default {PEERS})")
    parser.add_argument("--out", type=Path, default=Path("lm-outer-momentum-long.png"))
    parser.add_argument("--title", default=TITLE, help=f"the figure's title (default {TITLE!r})")
    args = parser.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = read_records(args.records)
    wanted = [f"{outer}, H={h}" for h in H_VALUES for outer in ("Nesterov", "averaging")]
    missing = [label for label in wanted if label not in runs]
    if missing:
        parser.error(
            f"{args.records}: no records of the runs {', '.join(missing)}; allowed: the "
            "records of lm-outer-momentum-long.toml or -drift.toml (sim compare --jsonl)"
        )
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    colours = {10: "tab:blue", 50: "tab:green", 200: "tab:purple"}
    lowest, highest = float("inf"), 0.0
    for h in H_VALUES:
        nesterov = curve(runs[f"Nesterov, H={h}"], args.peers)
        averaging = curve(runs[f"averaging, H={h}"], args.peers)
        for points, style, name in ((nesterov, "-", "Nesterov"), (averaging, "--", "averaging")):
            shown = [(s, b) for s, b in points if s > 0]
            left.plot(*zip(*shown), style, color=colours[h], marker=".", label=f"{name}, H={h}")
            lowest = min(lowest, *(b for _, b in shown))
            highest = max(highest, *(b for _, b in shown))
        gap = lead(nesterov, averaging)
        right.plot(*zip(*gap), "-", color=colours[h], marker=".", label=f"H={h}")
    if args.data_parallel is not None:
        [dp] = read_records(args.data_parallel).values()
        shown = [(s, b) for s, b in curve(dp, args.peers) if s > 0]
        left.plot(*zip(*shown), ":", color="black", label="data parallel")
        lowest = min(lowest, *(b for _, b in shown))
    left.set_ylim(lowest - 0.05, highest + 0.05)
    left.set_xlabel("inner steps per peer (equal tokens across runs)")
    left.set_ylabel("validation bits per byte (peers' average model)")
    left.set_title("outer Nesterov (solid) against plain averaging (dashed)")
    left.grid(alpha=0.3)
    left.legend(fontsize=8, ncol=2)
    right.axhline(0.0, color="grey", linewidth=0.8)
    right.set_xlabel("inner steps per peer")
    right.set_ylabel("Nesterov's lead (averaging − Nesterov), bits per byte")
    right.set_title("the lead at each H, along the runs")
    right.grid(alpha=0.3)
    right.legend(fontsize=9)
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
