"""The vectorized n-peer network simulator.

All peers' parameters are one ``[n, d]`` tensor; gradients for every peer come from one
``torch.func.vmap(grad)``; one optimizer over the stacked rows is n per-peer optimizers;
mixing is a gather along a ``topologies.NeighbourTable`` handed to a ``consensus`` rule.
A network model (``sim.network``) charges each round simulated time and bytes.

    >>> from sim.build import build   # doctest: +SKIP
    >>> from sim.config import ExperimentConfig, WorkloadConfig
    >>> from sim.runner import run
    >>> config = ExperimentConfig(rounds=20, workload=WorkloadConfig(dataset="synthetic"))
    >>> algorithm, ctx, evaluation = build(config)
    >>> records = run(algorithm, ctx, evaluation, rounds=20, eval_every=10)

Modules: ``engine`` (BatchedPeers, optimizers, gather_mix), ``reference`` (the naive
per-peer loop), ``network`` (links, compute, failures, cost formulas, discrete events),
``algorithms`` (baselines), ``gossip_runner`` (gossip algorithms, Byzantine peers),
``metrics``, ``runner``, ``config`` (TOML experiments, validated), ``build`` (a run from a
config), ``cli`` (``gossipnet sim``).
See docs/simulator.md.
"""
