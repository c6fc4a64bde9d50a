"""How long building a topology and its spectral gap take at large n (sparse solvers vs dense).

    python bench/topologies_scale.py [N ...]        # default: 256 1024 2048

For each topology and n: seconds to build the graph, to build its sparse mixing matrix, and to
compute the spectral gap with the sparse solvers (eigsh / svds on the deflated operator); the
reference is the same gap from a dense eigen/singular-value decomposition of the densified
matrix, measured in the same run. "dense/sparse" is how many times faster the sparse path is;
|Δgap| is the disagreement between the two.
"""

from __future__ import annotations

import sys
import time

from topologies import build, contraction_factor, mixing_matrix

NAMES = [
    "ring",
    "torus",
    "hypercube",
    "random-regular",
    "erdos-renyi",
    "small-world",
    "exponential",
    "exponential-undirected",
]


def _seconds(call):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    value = call()
    return value, time.perf_counter() - start


def main(sizes: list[int]) -> None:
    header = f"{'topology':<24}{'n':>6}{'build s':>9}{'W s':>8}{'gap s':>8}{'dense s':>9}{'dense/sparse':>14}{'gap':>12}{'|Δgap|':>10}"
    print(header)
    print("-" * len(header))
    for n in sizes:
        for name in NAMES:
            graph, build_s = _seconds(lambda: build(name, n))  # noqa: B023
            matrix, matrix_s = _seconds(lambda: mixing_matrix(graph))  # noqa: B023
            rho, gap_s = _seconds(lambda: contraction_factor(matrix, method="sparse"))  # noqa: B023
            dense_rho, dense_s = _seconds(lambda: contraction_factor(matrix, method="dense"))  # noqa: B023
            print(
                f"{name:<24}{n:>6}{build_s:>9.3f}{matrix_s:>8.3f}{gap_s:>8.3f}{dense_s:>9.3f}"
                f"{dense_s / gap_s:>14.1f}{1 - rho:>12.5g}{abs(rho - dense_rho):>10.1e}"
            )


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [256, 1024, 2048])
