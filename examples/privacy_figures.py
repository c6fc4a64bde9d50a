"""Draw docs/privacy.md's figures from the runs it lists (docs/privacy.md, "Audits" and
"Privacy-accuracy trade-off").

    python examples/privacy_figures.py --audit results/privacy-audit \\
        --audit-baseline results/privacy-audit-nodp --lm results/privacy-lm \\
        --lm-baseline lm-nodp.jsonl --out docs/figures

``--audit`` and ``--audit-baseline`` are ``gossipnet sim sweep`` folders of
examples/experiments/privacy-audit.toml (with and without ``[privacy]``, one series per
``optimizer.lr``); ``--lm`` a sweep folder of privacy-tradeoff-lm.toml and ``--lm-baseline``
the JSON lines of its non-private ``gossipnet sim run``. Every value drawn is a run's last
record; ε is the accountant's (δ = 1e-5), the non-private runs stand at the right edge.
Writes privacy-audit.png and privacy-tradeoff.png.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Row = dict[str, Any]


def _number(text: str) -> float:
    return math.nan if text in ("", "null") else float(text)


def last_rows(folder: Path) -> list[Row]:
    """Each run's last record of a sweep folder's results.csv, numbers as floats."""
    last: dict[str, Row] = {}
    with (folder / "results.csv").open(encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row["run"] not in last or int(row["round"]) > int(last[row["run"]]["round"]):
                last[row["run"]] = row
    out = []
    for row in last.values():
        converted: Row = {}
        for key, value in row.items():
            try:
                converted[key] = _number(value)
            except ValueError:
                converted[key] = value
        out.append(converted)
    return out


def last_record(path: Path) -> Row:
    """The last record of a ``sim run --jsonl`` file."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {k: (math.nan if v is None else v) for k, v in json.loads(lines[-1]).items()}


def _series(rows: Sequence[Row], by: str) -> dict[float, list[Row]]:
    groups: dict[float, list[Row]] = {}
    for row in rows:
        groups.setdefault(float(row[by]), []).append(row)
    return {key: sorted(value, key=lambda r: r["epsilon"]) for key, value in groups.items()}


def _epsilon_axis(axis: Any, epsilons: Sequence[float], edge: float) -> None:
    """Log ε axis with the non-private runs at ``edge``, labelled as no guarantee."""
    axis.set_xscale("log")
    ticks = [
        t for t in (0.5, 1, 2, 5, 10, 20, 50, 100) if min(epsilons) / 1.5 <= t <= max(epsilons)
    ]
    axis.set_xticks([*ticks, edge])
    axis.set_xticklabels([*(f"{t:g}" for t in ticks), "no DP\n(ε = ∞)"])
    axis.minorticks_off()
    axis.axvline(math.sqrt(edge * max(epsilons)), color="0.8", lw=0.8, ls=":")
    axis.set_xlabel("ε at δ = 1e-5 (Opacus RDP accountant)")
    axis.grid(alpha=0.3)


def draw(args: argparse.Namespace) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    audit = _series(last_rows(args.audit), "optimizer.lr")
    baseline = {float(r["optimizer.lr"]): r for r in last_rows(args.audit_baseline)}
    epsilons = [r["epsilon"] for rows in audit.values() for r in rows]
    edge = max(epsilons) * 4
    colours = {lr: colour for lr, colour in zip(sorted(audit, reverse=True), ("C0", "C1", "C2"))}
    written = []

    figure, axes = plt.subplots(1, 3, figsize=(15, 4.6), constrained_layout=True)
    panels = (
        ("membership_auc", "membership-inference ROC AUC", (0.4, 0.85)),
        ("membership_advantage", "membership advantage max(TPR − FPR)", (0.0, 0.65)),
        ("reconstruction_cosine", "reconstruction |cos(x̂, x)|", (0.0, 1.05)),
    )
    for axis, (key, label, limits) in zip(axes, panels, strict=True):
        for lr, rows in sorted(audit.items(), reverse=True):
            xs = [r["epsilon"] for r in rows]
            for suffix, style, what in (
                ("", "-o", "mean of 8 peers"),
                ("_max", "--^", "worst peer"),
            ):
                ys = [r[key + suffix] for r in rows]
                axis.plot(xs, ys, style, color=colours[lr], ms=5, label=f"lr {lr:g}, {what}")
                axis.plot([edge], [baseline[lr][key + suffix]], style[-1], color=colours[lr], ms=6)
        if key == "membership_auc":
            axis.axhspan(0.45, 0.55, color="0.85", zorder=0, label="within 0.05 of chance")
            axis.axhline(0.5, color="0.4", lw=0.8)
        if key == "membership_advantage":
            axis.axhline(0.0, color="0.4", lw=0.8)
        if key == "reconstruction_cosine":
            axis.axhline(0.3, color="C3", lw=1, ls=":", label="0.3")
        axis.set_ylim(*limits)
        axis.set_ylabel(label)
        _epsilon_axis(axis, epsilons, edge)
    axes[0].legend(fontsize=8, loc="upper left")
    axes[2].legend(fontsize=8, loc="center left")
    figure.suptitle(
        "Privacy audits, MNIST-1D, 8 peers on a ring, 200 examples each, 300 DP-SGD steps "
        "(C = 1, q = 0.16); σ = 8, 4, 2, 1, 0.5 from left to right",
        fontsize=11,
    )
    path = args.out / "privacy-audit.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    written.append(path)

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), constrained_layout=True)
    for lr, rows in sorted(audit.items(), reverse=True):
        xs = [r["epsilon"] for r in rows]
        for key, style, what in (
            ("test_accuracy", "-o", "average model"),
            ("peer_accuracy_worst", "--^", "worst peer"),
        ):
            ys = [r[key] for r in rows]
            left.plot(xs, ys, style, color=colours[lr], ms=5, label=f"lr {lr:g}, {what}")
            left.plot([edge], [baseline[lr][key]], style[-1], color=colours[lr], ms=6)
    left.axhline(0.1, color="0.4", lw=0.8, ls=":", label="chance (10 classes)")
    left.set_ylim(0, 0.6)
    left.set_ylabel("MNIST-1D test accuracy")
    left.set_title(
        "MNIST-1D MLP, 8 peers, 200 examples each, 300 steps; σ = 8 ... 0.5", fontsize=10
    )
    _epsilon_axis(left, epsilons, edge)
    left.legend(fontsize=8, loc="upper left")

    lm = sorted(last_rows(args.lm), key=lambda r: r["epsilon"])
    lm_none = last_record(args.lm_baseline)
    lm_eps = [r["epsilon"] for r in lm]
    lm_edge = max(lm_eps) * 4
    for key, style, what in (
        ("test_bits_per_byte", "-o", "average model"),
        ("peer_bits_per_byte_worst", "--^", "worst peer"),
    ):
        right.plot(lm_eps, [r[key] for r in lm], style, color="C2", ms=5, label=what)
        right.plot([lm_edge], [lm_none[key]], style[-1], color="C2", ms=6)
    for row in lm:
        right.annotate(
            f"σ = {row['privacy.noise']:g}",
            (row["epsilon"], row["test_bits_per_byte"]),
            textcoords="offset points",
            xytext=(6, 4),
            fontsize=8,
        )
    right.set_ylabel("validation bits per byte (lower is better)")
    right.set_title("byte-level GPT (1 layer, width 32), 4 peers, 150 steps", fontsize=10)
    _epsilon_axis(right, lm_eps, lm_edge)
    right.legend(fontsize=8, loc="upper right")
    figure.suptitle("Privacy-accuracy trade-off of DP-SGD per peer (D-PSGD on a ring)", fontsize=11)
    path = args.out / "privacy-tradeoff.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--audit", type=Path, required=True)
    parser.add_argument("--audit-baseline", type=Path, required=True)
    parser.add_argument("--lm", type=Path, required=True)
    parser.add_argument("--lm-baseline", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("docs/figures"))
    for path in draw(parser.parse_args()):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
