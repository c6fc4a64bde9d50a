"""gossipnet: decentralized gossip training of PyTorch models.

The distribution is split into layered packages (see ``docs/architecture.md``):

* :mod:`topologies` - who talks to whom, mixing weights, spectral gap;
* :mod:`workloads` - data sets, partitions across peers, small models;
* :mod:`consensus` - robust aggregation rules and Byzantine attacks;
* :mod:`gossip` - per-node update rules and compressors, shared by both runners;
* :mod:`sim` - the vectorized n-peer simulator;
* :mod:`peer` - the networked peer (aiohttp + msgpack).

This package is only the front door: the ``gossipnet`` command and the version.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("gossipnet")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
