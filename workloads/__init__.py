"""What peers train: data sets (no download at run time), partitions across peers, small models.

Both runners use this package: the simulator draws ``[n, B, ...]`` batches for
all peers at once (:class:`StackedBatchSampler`), a networked peer iterates its
own (:func:`peer_batches`), and the two see the same samples for the same seed. Both
keep generated data sets in :func:`default_cache_dir`; :func:`train_centralized` is the
one-model reference a swarm is compared with. A language model (``text`` data set, ``gpt``
model) is scored by validation loss and bits per byte, a classifier by accuracy, a
regression by the mean squared error (:mod:`workloads.task`, which also checks a model
against the data before a run: :func:`check_model_fits`); :func:`generate` continues a prompt with a trained model. Your own model or data set code comes in as
``MODULE:FACTORY`` (:mod:`workloads.user_code`), an ``.npz`` file as ``FILE.npz``.

    >>> from workloads import load_dataset, partition, build_model, StackedBatchSampler
    >>> data = load_dataset("synthetic:num_samples=400,seed=0")
    >>> parts = partition("dirichlet:alpha=0.5", data.y_train, num_peers=4, seed=0)
    >>> model = build_model("mlp", data.input_shape, data.num_classes, seed=0)
    >>> x, y = StackedBatchSampler(parts, batch_size=16, seed=0).sample(data, step=0)
    >>> tuple(x.shape)
    (4, 16, 20)

See docs/workloads.md.
"""

from workloads._registry import Param
from workloads.baseline import CentralizedResult, train_centralized
from workloads.batching import (
    PeerBatchSampler,
    StackedBatchSampler,
    feistel_permutation,
    peer_batches,
    splitmix64,
)
from workloads.cache import default_cache_dir
from workloads.datasets import (
    DATASETS,
    DEFAULT_DATASET,
    Dataset,
    DatasetConfig,
    check_dataset_spec,
    load_dataset,
)
from workloads.device import resolve_device
from workloads.formats import DataFileError, UnsafePickleError, read_idx
from workloads.gpt import GPT, generate
from workloads.models import (
    MODELS,
    NotBatchableError,
    build_model,
    check_batchable,
    check_model_spec,
    layer_chain,
    parameter_count,
    register_model,
)
from workloads.partition import (
    PARTITIONS,
    check_partition_spec,
    contiguous,
    dirichlet,
    iid,
    label_histogram,
    partition,
    shards,
)
from workloads.task import (
    TASKS,
    ModelMismatchError,
    Task,
    bits_per_byte,
    check_model_fits,
    cross_entropy,
    evaluate,
    mean_squared_error,
    metrics,
)
from workloads.text import text
from workloads.user_code import UserCodeError

__all__ = [
    "DATASETS",
    "DEFAULT_DATASET",
    "GPT",
    "MODELS",
    "PARTITIONS",
    "TASKS",
    "CentralizedResult",
    "DataFileError",
    "Dataset",
    "DatasetConfig",
    "ModelMismatchError",
    "NotBatchableError",
    "Param",
    "PeerBatchSampler",
    "StackedBatchSampler",
    "Task",
    "UnsafePickleError",
    "UserCodeError",
    "bits_per_byte",
    "build_model",
    "check_batchable",
    "check_dataset_spec",
    "check_model_fits",
    "check_model_spec",
    "check_partition_spec",
    "contiguous",
    "cross_entropy",
    "default_cache_dir",
    "dirichlet",
    "evaluate",
    "feistel_permutation",
    "generate",
    "iid",
    "label_histogram",
    "layer_chain",
    "load_dataset",
    "mean_squared_error",
    "metrics",
    "parameter_count",
    "partition",
    "peer_batches",
    "read_idx",
    "register_model",
    "resolve_device",
    "shards",
    "splitmix64",
    "text",
    "train_centralized",
]
