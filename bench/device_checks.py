"""The language model's checks on an accelerator, as one prepared script: what a session that
is lent a GPU runs first (its device time is short: one call, a few minutes).

    PYTHONPATH=. python3 bench/device_checks.py --device cuda --out "$OUT"
    .venv/bin/python bench/device_checks.py --device cpu --quick      # the same steps, here

Each step is timed and reported, and a failing step does not stop the others:

1. ``environment``: torch, the device's name.
2. ``simulator``: DiLoCo (H = 10, outer Nesterov, an exact all-reduce) over 8 peers of the
   small gpt of docs/low-communication.md on the standard library's sources, ``--rounds``
   outer steps on the CPU and on ``--device``: final validation bits per byte of each (they
   agree up to float rounding) and wall time.
3. ``throughput``: ``bench/sim_throughput.py --rows gpt --gpt-device DEVICE`` at 16 peers for
   the default gpt, ``width=64`` and the small gpt: the engine's kernels against a per-peer
   loop, on that device.
4. ``peer``: ``gossipnet launch`` of 4 NoLoCo peers training ``gpt:width=64`` with
   ``--device DEVICE`` (docs/low-communication.md, "Try it"): each peer's bits per byte and
   the wall time.
5. ``tests``: ``pytest tests/sim/test_device.py`` (the CUDA tests run where CUDA is).

Prints one line per step as it ends; with ``--out DIR`` writes ``device_checks.json`` and
each step's output there (``$OUT`` of the device tool comes back).

The GPU machine's image has torch, aiohttp, msgpack, networkx, rich, safetensors and
prometheus-client, but not this project, ``cryptography`` (the peer's signatures) or
``mnist1d`` (the tests' data), and nothing can be fetched there. So fetch their wheels here
for its Python 3.12 (4.9 MB; ``wheels/`` is ignored by git), carry them, and install them
there first::

    .venv/bin/pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
        --dest wheels cryptography cffi pycparser mnist1d
    # the device tool's run, carry ["wheels"]:
    python3 -m pip install -q --no-index --no-deps wheels/*.whl && \
        PYTHONPATH=. python3 bench/device_checks.py --device cuda --out "$OUT"

About 35 s on 2 CPU cores with ``--device cpu --quick --rounds 10``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SMALL_GPT = "gpt:layers=2,width=32,heads=2"
THROUGHPUT_MODELS = (("gpt", 8, 64), ("gpt:width=64", 4, 64), (SMALL_GPT, 4, 32))


def _environment(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from workloads import resolve_device

    device = resolve_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"torch": torch.__version__, "device": str(device), "name": name}


def _simulator(args: argparse.Namespace) -> dict[str, Any]:
    from sim.build import build
    from sim.config import experiment_from_dict
    from sim.runner import run

    point: dict[str, Any] = {
        "name": "device-check",
        "seed": 0,
        "rounds": args.rounds,
        "eval_every": args.rounds,
        "workload": {
            "dataset": "text:context=32,val_fraction=0.05",
            "partition": "iid",
            "model": SMALL_GPT,
            "peers": 8,
            "batch_size": 8,
        },
        "optimizer": {"name": "adamw", "lr": 0.0003},
        "algorithm": {
            "name": "allreduce",
            "local_steps": 10,
            "outer_optimizer": "sgd:lr=0.7,momentum=0.9,nesterov=true",
        },
    }
    result: dict[str, Any] = {}
    for device in dict.fromkeys(("cpu", args.device)):  # once when --device is cpu
        config = experiment_from_dict({**point, "device": device})
        start = time.perf_counter()
        algorithm, ctx, evaluation = build(config)
        records = list(run(algorithm, ctx, evaluation, rounds=config.rounds))
        result[device] = {
            "bits_per_byte": records[-1].test_bits_per_byte,
            "wall_s": round(time.perf_counter() - start, 2),
        }
    a, b = result["cpu"]["bits_per_byte"], result[args.device]["bits_per_byte"]
    result["difference"] = abs(a - b)
    return result


def _run(command: list[str], out: Path | None, name: str, timeout: int) -> dict[str, Any]:
    """A child process, its last lines and wall time; its whole output to ``out/name.txt``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    start = time.perf_counter()
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )
    wall = round(time.perf_counter() - start, 2)
    if out is not None:
        (out / f"{name}.txt").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    return {
        "returncode": done.returncode,
        "wall_s": wall,
        "stdout": done.stdout,
        "stderr": done.stderr,
    }


def _throughput(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    models = THROUGHPUT_MODELS[-1:] if args.quick else THROUGHPUT_MODELS
    for model, batch, context in models:
        done = _run(
            [sys.executable, "bench/sim_throughput.py", "--rows", "gpt", "--steps", "3",
             "--repeats", "3", "--threads", "1", "--gpt-model", model, "--gpt-batch",
             str(batch), "--gpt-context", str(context), "--gpt-device", args.device],
            args.out, f"throughput-{model.replace(':', '_').replace(',', '_')}", 600,
        )  # fmt: skip
        if done["returncode"] != 0:
            raise RuntimeError(done["stderr"][-1500:])
        rows.append({"model": model, "table": done["stdout"].strip().splitlines()[-2:]})
    return {"rows": rows}


def _peer(args: argparse.Namespace) -> dict[str, Any]:
    steps = "40" if args.quick else "200"
    done = _run(
        [sys.executable, "-m", "gossipnet", "launch", "--peers", "4", "--dataset",
         "text:context=64,max_bytes=300000", "--model", "gpt:width=64", "--optimizer", "adamw",
         "--lr", "0.003", "--batch-size", "8", "--steps", steps, "--algorithm", "noloco",
         "--topology", "random-matching", "--local-steps", "20", "--device", args.device,
         "--no-centralized", "--progress", "none", "--json"],
        args.out, "peer", 600,
    )  # fmt: skip
    if done["returncode"] != 0:
        raise RuntimeError(done["stderr"][-1500:])
    results = json.loads(done["stdout"].splitlines()[-1])
    return {
        "wall_s": done["wall_s"],
        "steps": int(steps),
        "bits_per_byte": {p["id"]: p.get("test_bits_per_byte") for p in results["peers"]},
    }


def _tests(args: argparse.Namespace) -> dict[str, Any]:
    done = _run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/sim/test_device.py",
        ],
        args.out,
        "tests",
        600,
    )
    summary = [
        line for line in done["stdout"].splitlines() if " passed" in line or " failed" in line
    ]
    return {"returncode": done["returncode"], "summary": summary[-1:] or done["stdout"][-500:]}


STEPS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "environment": _environment,
    "simulator": _simulator,
    "throughput": _throughput,
    "peer": _peer,
    "tests": _tests,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:I or cpu (default cuda)")
    parser.add_argument("--rounds", type=int, default=40, help="simulator outer steps (default 40)")
    parser.add_argument(
        "--steps", default=",".join(STEPS), help=f"which steps (default {','.join(STEPS)})"
    )
    parser.add_argument("--quick", action="store_true", help="fewer models and peer steps")
    parser.add_argument("--out", type=Path, help="folder for device_checks.json and the outputs")
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in STEPS]
    if unknown:
        parser.error(f"--steps: unknown {', '.join(unknown)}; allowed: {', '.join(STEPS)}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    for name in chosen:
        start = time.perf_counter()
        try:
            report[name] = {"ok": True, **STEPS[name](args)}
        except Exception as error:  # a step that fails is reported; the others still run
            report[name] = {"ok": False, "error": f"{type(error).__name__}: {error}"[-2000:]}
        report[name]["step_s"] = round(time.perf_counter() - start, 2)
        shown = {k: v for k, v in report[name].items() if k not in ("stdout", "stderr")}
        print(f"{name}: {json.dumps(shown, default=str)}", flush=True)
    if args.out is not None:
        (args.out / "device_checks.json").write_text(json.dumps(report, indent=2, default=str))
    return 0 if all(step["ok"] for step in report.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
