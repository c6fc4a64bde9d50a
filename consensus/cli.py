"""``gossipnet consensus``: list the aggregation rules and attacks, or check a spec string."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from consensus.attacks import build_attack, describe_attacks
from consensus.build import build, describe_aggregators


def _parser(prog: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog=prog,
        description=(
            "Robust aggregation rules (what --aggregator accepts) and Byzantine attacks "
            "(what --attack accepts). With no option, list both; with one, build it and "
            "print what it resolved to. See docs/consensus.md."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=describe_aggregators() + "\n\n" + describe_attacks(),
    )


def main(argv: Sequence[str], prog: str = "gossipnet consensus") -> int:
    """Run the subcommand; returns the exit code (2 with one line on a bad spec)."""
    parser = _parser(prog)
    parser.add_argument("--aggregator", metavar="SPEC", help="an aggregator spec to check")
    parser.add_argument("--attack", metavar="SPEC", help="an attack spec to check")
    args = parser.parse_args(list(argv))
    if args.aggregator is None and args.attack is None:
        print(describe_aggregators() + "\n\n" + describe_attacks())
        return 0
    try:
        if args.aggregator is not None:
            print(f"aggregator {args.aggregator}: {build(args.aggregator)!r}")
        if args.attack is not None:
            print(f"attack {args.attack}: {build_attack(args.attack)!r}")
    except ValueError as error:
        parser.error(str(error))
    return 0
