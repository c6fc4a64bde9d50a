"""``python -m topologies.report``: the markdown table of docs/topologies.md, computed.

For each registered topology: its degree, the spectral gap of its default mixing matrix
(Metropolis–Hastings, or uniform for the directed exponential graph) at n = 16, 64, 256, the
rounds to shrink disagreement 1000-fold at n = 256, and when to use it. Random topologies use
their default parameters and seed 0.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from topologies.mixing import mixing_matrix
from topologies.registry import TOPOLOGIES, build
from topologies.spectral import contraction_factor, rounds_from_contraction

SIZES = (16, 64, 256)


def markdown_table(sizes: Sequence[int] = SIZES) -> str:
    """The table as markdown text (one line per topology)."""
    header = (
        ["topology", "degree"]
        + [f"gap n={n}" for n in sizes]
        + [f"rounds to 1e-3, n={sizes[-1]}", "when to use"]
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for spec in TOPOLOGIES.values():
        gaps = []
        rounds = ""
        for n in sizes:
            rho = contraction_factor(mixing_matrix(build(spec.name, n)))
            gaps.append(f"{1.0 - rho:.4g}")
            rounds = str(rounds_from_contraction(rho, 1e-3))
        name = f"`{spec.name}`" + (" (directed)" if spec.directed else "")
        lines.append("| " + " | ".join([name, spec.degree, *gaps, rounds, spec.use_when]) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    sizes = tuple(int(a) for a in (sys.argv[1:] if argv is None else argv)) or SIZES
    print(markdown_table(sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
