"""gossipnet: decentralized gossip training of PyTorch models.

The distribution is split into layered packages (see ``docs/architecture.md``):

* :mod:`topologies` - who talks to whom, mixing weights, spectral gap;
* :mod:`workloads` - data sets, partitions across peers, small models;
* :mod:`consensus` - robust aggregation rules and Byzantine attacks;
* :mod:`gossip` - per-node update rules and compressors, shared by both runners;
* :mod:`sim` - the vectorized n-peer simulator;
* :mod:`peer` - the networked peer (aiohttp + msgpack).

This package is only the front door: the ``gossipnet`` command, the version,
:func:`load_model` (a model written by ``gossipnet peer --save-model``, ``launch
--save-model`` or ``gossipnet export``, rebuilt as a ready ``nn.Module``, a model of your
own code re-imported from the current directory; it is ``peer.node.model_file.load_model``) and :class:`BackgroundPeer` (``peer.node.background``: gossip
from an ordinary synchronous training loop), each imported on first use so that
``import gossipnet`` stays light.

    >>> import gossipnet
    >>> model = gossipnet.load_model("model.safetensors")  # doctest: +SKIP
    >>> with gossipnet.BackgroundPeer(model, optimizer, config):  # doctest: +SKIP
    ...     train()  # your loop; optimizer.step() gossips
"""

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from peer.node.model_file import load_model as load_model

try:
    __version__ = version("gossipnet")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

__all__ = ["BackgroundPeer", "__version__", "load_model"]


def __getattr__(name: str) -> Any:
    """``gossipnet.load_model`` (from ``peer.node.model_file``) and ``gossipnet.BackgroundPeer``
    (from ``peer.node.background``), imported when first asked for."""
    if name == "load_model":
        from peer.node.model_file import load_model

        return load_model
    if name == "BackgroundPeer":
        # by name, as the command's dispatcher imports a subcommand: the peer's network
        # stack (aiohttp) stays out of this package's static imports (an import-linter
        # contract); the class itself is ``peer.node.background.BackgroundPeer``
        return importlib.import_module("peer.node.background").BackgroundPeer
    raise AttributeError(f"module 'gossipnet' has no attribute {name!r}")
