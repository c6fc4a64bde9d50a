"""The language-model workload: the byte-level text data set, the gpt model, the task's
metrics, user .npz token data, and text generation."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.func import functional_call, grad, vmap

from sim.batched import BatchedPeers
from workloads import (
    DataFileError,
    build_model,
    check_batchable,
    cross_entropy,
    evaluate,
    generate,
    load_dataset,
    parameter_count,
    partition,
)
from workloads.task import TASKS, metrics

TINY = "gpt:layers=1,width=16,heads=2"


def _corpus(folder: Path, files: int = 12) -> Path:
    """A folder of small text files with different content, so a split by file shows."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        line = f"file {i:02d}: " + "abcdefghij"[i % 10] * 20 + "\n"
        (folder / f"f{i:02d}.txt").write_text(line * 30)
    return folder


def _files_of(data_x: torch.Tensor) -> set[str]:
    text = bytes(data_x.flatten().tolist()).decode()
    return {text[i + 5 : i + 7] for i in range(len(text)) if text.startswith("file ", i)}


def test_text_splits_by_file_with_the_seed(tmp_path: Path) -> None:
    folder = _corpus(tmp_path / "corpus")
    spec = f"text:path={folder},context=16,val_fraction=0.25,max_bytes=100000"
    first, again = load_dataset(spec, seed=1), load_dataset(spec, seed=1)
    assert torch.equal(first.x_train, again.x_train) and torch.equal(first.x_test, again.x_test)
    train, test = _files_of(first.x_train), _files_of(first.x_test)
    assert train and test and not train & test  # no file on both sides
    other = load_dataset(spec, seed=2)
    assert _files_of(other.x_test) != test
    assert first.task == "language-model" and first.num_classes == 256
    assert first.x_train.dtype == torch.int64 and first.input_shape == (16,)


def test_contexts_and_next_bytes_are_shifted_by_one(tmp_path: Path) -> None:
    single = tmp_path / "one.txt"
    single.write_bytes(bytes(range(256)) * 4)
    data = load_dataset(f"text:path={single},context=8,val_fraction=0.25")
    assert torch.equal(data.y_train[:, :-1], data.x_train[:, 1:])
    assert torch.equal(data.y_train[:-1, -1], data.x_train[1:, 0])  # across contexts too
    assert int(data.x_train[0, 0]) == 0 and int(data.y_train[0, 0]) == 1
    assert data.num_test == (256 - 1) // 8  # a single file's last quarter validates


def test_default_text_is_the_standard_library_and_loads_fast() -> None:
    import time

    start = time.perf_counter()
    data = load_dataset("text:context=64,max_bytes=200000")
    assert time.perf_counter() - start < 2.0
    assert data.num_train * 64 > 150_000 and data.num_test >= 1
    assert b"def " in bytes(data.x_train[:200].flatten().tolist())


def test_text_refuses_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="text: context must be an integer >= 1"):
        load_dataset("text:context=0")
    with pytest.raises(ValueError, match=r"text: val_fraction must lie in \(0, 1\)"):
        load_dataset("text:val_fraction=1.5")
    with pytest.raises(DataFileError, match="neither a file nor a folder"):
        load_dataset(f"text:path={tmp_path / 'missing'}")
    short = tmp_path / "short.txt"
    short.write_text("tiny")
    with pytest.raises(DataFileError, match="fewer than context"):
        load_dataset(f"text:path={short},context=64")


def test_language_model_partition_is_iid_or_contiguous(tmp_path: Path) -> None:
    data = load_dataset(f"text:path={_corpus(tmp_path / 'c')},context=16")
    parts = partition("iid", data.y_train, num_peers=3, seed=0)
    assert sorted(torch.cat(parts).tolist()) == list(range(data.num_train))
    with pytest.raises(
        ValueError, match=r"dirichlet: splits by class label.*allowed: iid, contiguous"
    ):
        partition("dirichlet", data.y_train, num_peers=3)


def test_contiguous_gives_each_peer_its_own_files(tmp_path: Path) -> None:
    """The non-iid split of a language model: iid spreads every training file over every
    peer; contiguous gives each peer a run of the files, sharing at most the file a cut falls
    in with the next peer."""
    data = load_dataset(f"text:path={_corpus(tmp_path / 'c', files=24)},context=16")

    def files_of(indices: torch.Tensor) -> set[str]:  # the file numbers its contexts show
        found = set()
        for index in indices.tolist():
            text = bytes(data.x_train[index].tolist()).decode()
            found |= {
                text[i + 5 : i + 7] for i in range(len(text) - 6) if text[i:].startswith("file ")
            }
        return found

    training_files = _files_of(data.x_train)
    mixed = partition("iid", data.y_train, num_peers=4, seed=0)
    own = partition("contiguous", data.y_train, num_peers=4)
    assert torch.equal(torch.cat(own), torch.arange(data.num_train))  # in order, all of it
    assert max(len(p) for p in own) - min(len(p) for p in own) <= 1
    for part in mixed:
        assert files_of(part) == training_files
    files = [files_of(part) for part in own]
    assert set().union(*files) == training_files
    for p in range(4):
        assert len(files[p]) <= len(training_files) // 4 + 2
        for q in range(p + 2, 4):  # not neighbours in the order: nothing in common
            assert not files[p] & files[q]


def test_gpt_is_causal_tied_and_seeded() -> None:
    model = build_model(TINY, (12,), 256, seed=3)
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    logits = model(tokens)
    assert logits.shape == (2, 12, 256)
    changed = tokens.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 256
    after = model(changed)
    assert torch.equal(after[:, :7], logits[:, :7])  # earlier positions never see byte 7
    assert not torch.allclose(after[:, 7:], logits[:, 7:])
    assert "embedding.weight" in dict(model.named_parameters())
    assert not any("head" in name for name, _ in model.named_parameters())  # tied output
    with torch.no_grad():
        model.embedding.weight[5] += 1.0  # the output row of byte 5 moves with its input row
    assert not torch.allclose(model(tokens)[..., 5], logits[..., 5])
    again = build_model(TINY, (12,), 256, seed=3)
    assert all(
        torch.equal(a, b)
        for a, b in zip(again.parameters(), build_model(TINY, (12,), 256, seed=3).parameters())
    )
    assert parameter_count(build_model("gpt", (128,), 256)) == 445_952
    with pytest.raises(ValueError, match="gpt: width \\(30\\) must be a multiple of heads"):
        build_model("gpt:width=30,heads=4", (8,), 256)


def test_batched_gradients_equal_a_loop_over_peers() -> None:
    n, length = 3, 10
    template = build_model(TINY, (length,), 256, seed=0)
    check_batchable(template, torch.zeros(2, length, dtype=torch.int64))
    peers = BatchedPeers(lambda: build_model(TINY, (length,), 256, seed=0), n, init="independent")
    generator = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (n, 4, length), generator=generator)
    y = torch.randint(0, 256, (n, 4, length), generator=generator)
    losses, grads = peers.gradients(x, y)
    for i in range(n):
        model = peers.module(i)
        loss = cross_entropy(model(x[i]), y[i])
        loss.backward()
        expected = torch.cat([p.grad.flatten() for p in model.parameters()])
        assert torch.allclose(losses[i], loss.detach(), atol=1e-5)
        assert torch.allclose(grads[i], expected, atol=1e-5, rtol=1e-4)
    accuracy, loss = peers.evaluate(x[0], y[0], batch_size=2 * length)  # chunks of 2 contexts
    for i in range(n):
        scores = evaluate(peers.module(i), x[0], y[0], "language-model")
        assert math.isclose(float(loss[i]), scores["loss"], rel_tol=1e-5)
        assert math.isclose(float(accuracy[i]), scores["accuracy"], rel_tol=1e-9)


def test_vmap_of_the_loss_matches_functional_call() -> None:
    model = build_model(TINY, (6,), 256, seed=0)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randint(0, 256, (2, 3, 6), generator=torch.Generator().manual_seed(0))

    def loss(p: dict[str, torch.Tensor], xb: torch.Tensor) -> torch.Tensor:
        return cross_entropy(functional_call(model, p, (xb,)), xb)

    stacked = {k: torch.stack([v, v]) for k, v in params.items()}
    batched = vmap(grad(loss))(stacked, x)
    single = grad(loss)(params, x[1])
    assert all(torch.allclose(batched[k][1], single[k], atol=1e-6) for k in params)


def test_metrics_of_a_language_model_are_loss_and_bits_per_byte() -> None:
    scores = metrics("language-model", accuracy=0.25, loss=2.0)
    assert list(scores) == list(TASKS["language-model"].metric_names)
    assert scores["bits_per_byte"] == pytest.approx(2.0 / math.log(2))
    assert list(metrics("classification", accuracy=0.5, loss=1.0)) == ["accuracy", "loss"]
    uniform = torch.zeros(1, 4, 256)  # a uniform byte model spends 8 bits a byte
    assert cross_entropy(uniform, torch.zeros(1, 4, dtype=torch.int64)) / math.log(
        2
    ) == pytest.approx(8.0)
    with pytest.raises(
        ValueError, match="task: got 'vision'; allowed: classification, language-model"
    ):
        metrics("vision", accuracy=0.0, loss=0.0)


def test_user_npz_with_next_tokens_is_a_language_model(tmp_path: Path) -> None:
    stream = np.arange(2001) % 50
    x = stream[:-1].reshape(100, 20)
    y = stream[1:].reshape(100, 20)
    np.savez(tmp_path / "tokens.npz", x=x, y=y)
    data = load_dataset(str(tmp_path / "tokens.npz"))
    assert data.task == "language-model" and data.num_classes == 50
    assert data.x_train.shape[1:] == (20,) and data.y_test.shape[1:] == (20,)
    np.savez(tmp_path / "labels.npz", x=x.astype(np.float32), y=np.arange(100) % 3)
    assert load_dataset(str(tmp_path / "labels.npz")).task == "classification"
    np.savez(tmp_path / "bad.npz", x=x, y=y[:, :5])
    with pytest.raises(
        DataFileError,
        match=r"key 'y' \(dtype int64, shape \(100, 5\)\) says no task; allowed: 1-D integer "
        r"labels \[N\].*next tokens \[N, L\]",
    ):
        load_dataset(str(tmp_path / "bad.npz"))
    np.savez(tmp_path / "floaty.npz", x=x.astype(np.float32), y=y)
    with pytest.raises(DataFileError, match="key 'x' must hold integer tokens"):
        load_dataset(str(tmp_path / "floaty.npz"))


def test_generate_is_seeded_and_greedy_is_deterministic() -> None:
    model = build_model(TINY, (8,), 256, seed=0)
    greedy = generate(model, "import ", 12)
    assert greedy == generate(model, "import ", 12)
    assert len(greedy.encode("utf-8", "surrogateescape")) == 12
    sampled = generate(model, b"import ", 12, temperature=1.0, seed=4)
    assert sampled == generate(model, b"import ", 12, temperature=1.0, seed=4)
    assert sampled != generate(model, b"import ", 12, temperature=1.0, seed=5)
    assert model.training  # the mode is restored
