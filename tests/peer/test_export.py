"""A model you can take home: --save-model, load_model, gossipnet export, and hostile files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save as safetensors_save

from peer.app import export
from peer.app.export import main
from peer.app.model_average import average_models
from peer.node import checkpoint
from peer.node import model_file as model_file_module
from peer.node.config import PeerConfig
from peer.node.model_file import ExportError, load_model, save_model, sidecar_path
from peer.node.peer import Peer
from peer.node.recipe import RECIPE_KEY, ModelRecipe
from workloads import MODELS, build_model, load_dataset, partition, peer_batches, register_model

ROOT = Path(__file__).resolve().parents[2]
SECRET = b"export-test-swarm-secret-0123456789"
SYNTHETIC = "synthetic:num_samples=200,seed=0"


async def trained_checkpoint(folder: Path, peer_id: str, seed: int, steps: int = 4) -> Peer:
    """A peer of a workloads model that trained ``steps`` steps alone and checkpointed."""
    data = load_dataset(SYNTHETIC)
    recipe = ModelRecipe(
        "mlp:hidden=8", data.input_shape, data.num_classes, dataset=SYNTHETIC, seed=seed
    )
    batches = peer_batches(
        data, partition("iid", data.y_train, num_peers=1, seed=0)[0], batch_size=8, seed=seed
    )
    config = PeerConfig(peer_id=peer_id, checkpoint_dir=str(folder), secret=SECRET)
    peer = Peer(
        recipe.build(),
        lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        torch.nn.functional.cross_entropy,
        batches,
        config,
        recipe=recipe,
    )
    await peer.start()
    await peer.run(steps=steps)
    await peer.stop()  # the final checkpoint
    return peer


def state_of(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in module.state_dict().items()}


def assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


# --------------------------------------------------------------------------- a real peer


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_saved_model_gives_the_accuracy_the_peer_reported(tmp_path: Path) -> None:
    model_file = tmp_path / "model.safetensors"
    report = tmp_path / "eval.json"
    dataset = f"mnist1d:num_samples=2000,cache_dir={tmp_path / 'cache'}"
    env = {**os.environ, "GOSSIPNET_SECRET": SECRET.decode()}
    command = [sys.executable, "-m", "gossipnet", "peer", "--id", "solo", "--dataset", dataset,
               "--model", "mlp:hidden=64", "--steps", "300", "--status-every", "100",
               "--progress", "lines", "--eval-out", str(report),
               "--save-model", str(model_file)]  # fmt: skip
    result = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    reported = json.loads(report.read_text())
    document = json.loads(sidecar_path(model_file).read_text())
    assert document["format"] == "gossipnet-model-1"
    assert document["model"] == {"spec": "mlp:hidden=64", "seed": 0}
    # the cache folder is this machine's: not recorded in what a user takes home
    assert document["data"] == {
        "dataset": "mnist1d:num_samples=2000",
        "input_shape": [40],
        "num_classes": 10,
    }
    assert (document["step"], document["peer_id"]) == (300, "solo")
    assert document["evaluation"]["test_accuracy"] == reported["test_accuracy"]

    model = load_model(model_file)
    assert not model.training
    data = load_dataset(dataset)
    with torch.no_grad():
        output = model(data.x_test)
    accuracy = float((output.argmax(-1) == data.y_test).float().mean())
    loss = float(torch.nn.functional.cross_entropy(output, data.y_test))
    assert reported["test_accuracy"] > 0.3  # it learned something: the check below means it
    assert abs(accuracy - reported["test_accuracy"]) <= 1e-6
    assert abs(loss - reported["test_loss"]) <= 1e-5


# --------------------------------------------------------------------------- export


async def test_export_of_a_checkpoint_folder_is_the_peers_model(tmp_path: Path) -> None:
    peer = await trained_checkpoint(tmp_path / "a.checkpoints", "a", seed=0)
    out = tmp_path / "a.safetensors"
    assert main([str(tmp_path / "a.checkpoints"), "--out", str(out)]) == 0
    assert_same_state(state_of(load_model(out)), state_of(peer.model))
    document = json.loads(sidecar_path(out).read_text())
    assert (document["step"], document["peer_id"], document["averaged_from"]) == (4, "a", None)
    # a checkpoint folder and a checkpoint file load directly too
    assert_same_state(state_of(load_model(tmp_path / "a.checkpoints")), state_of(peer.model))
    newest = checkpoint.latest_checkpoint(tmp_path / "a.checkpoints")
    assert newest is not None
    assert_same_state(state_of(load_model(newest)), state_of(peer.model))


async def test_export_of_two_peers_is_their_average(tmp_path: Path) -> None:
    a = await trained_checkpoint(tmp_path / "peer-0.checkpoints", "a", seed=0)
    b = await trained_checkpoint(tmp_path / "peer-1.checkpoints", "b", seed=1, steps=6)
    expected = {
        name: (t.double() + state_of(b.model)[name].double()).div(2).float()
        for name, t in state_of(a.model).items()
    }
    out = tmp_path / "swarm.safetensors"
    args = [str(tmp_path / "peer-0.checkpoints"), str(tmp_path / "peer-1.checkpoints")]
    assert main([*args, "--out", str(out)]) == 0
    averaged = state_of(load_model(out))
    assert_same_state(averaged, expected)
    assert any(not torch.equal(averaged[n], state_of(a.model)[n]) for n in averaged)
    document = json.loads(sidecar_path(out).read_text())
    assert [(s["peer_id"], s["step"]) for s in document["averaged_from"]] == [("a", 4), ("b", 6)]
    assert document["step"] == 6 and document["peer_id"] is None
    # launch's folder of peer folders gives the same average; so does the Python call
    again = average_models([tmp_path], tmp_path / "again.safetensors")
    assert_same_state(state_of(load_model(again)), expected)


async def test_export_refuses_to_average_different_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await trained_checkpoint(tmp_path / "a", "a", seed=0)
    module = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(20, 10))
    other = ModelRecipe("logistic", (20,), 10)
    save_model(tmp_path / "other.safetensors", module, other)
    out = tmp_path / "x.safetensors"
    code = main([str(tmp_path / "a"), str(tmp_path / "other.safetensors"), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "other.safetensors" in err and "only the same model can be averaged" in err
    assert not out.exists()


def test_export_errors_are_one_line_naming_the_argument(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tmp_path / "missing"), "--out", str(tmp_path / "m.st")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path / 'missing'}: no such file or folder" in err
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), "--out", str(tmp_path / "m.st")]) == 2
    assert "no checkpoint-*.safetensors" in capsys.readouterr().err
    old = checkpoint.save_checkpoint(
        tmp_path / "old", {"flat": torch.zeros(3)}, step=1, round=0, peer_id="a"
    )
    assert main([str(old), "--out", str(tmp_path / "m.st")]) == 2
    assert "does not record its model" in capsys.readouterr().err
    recipe = ModelRecipe("mlp:hidden=4", (3,), 2)
    save_model(tmp_path / "ok.safetensors", recipe.build(), recipe)
    assert main([str(tmp_path / "ok.safetensors"), "--out", str(tmp_path / "no" / "m.st")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # --out is required
        main([str(tmp_path / "ok.safetensors")])
    assert exit_info.value.code == 2 and "--out" in capsys.readouterr().err
    ok = [str(tmp_path / "ok.safetensors"), "--out", str(tmp_path / "m.st")]
    for flag, value, says in [
        ("--model", "mlp", "--model: must be your model code as FILE:FACTORY"),
        ("--dataset", str(tmp_path / "none.npz"), "--dataset: "),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            main([*ok, flag, value])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1 and says in err, err


def normalized(input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    """A model of the user's own code, with buffers (BatchNorm's running statistics)."""
    return torch.nn.Sequential(
        torch.nn.Linear(input_shape[0], 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, num_classes)
    )


def test_buffers_travel_with_the_model_and_a_factory_rebuilds_it(tmp_path: Path) -> None:
    recipe = ModelRecipe("mymodel.py:normalized", (5,), 3)
    module = normalized((5,), 3)
    module(torch.randn(16, 5))  # moves the running statistics away from their initial values
    path = save_model(tmp_path / "model", module, recipe, step=7, peer_id="p")
    assert sidecar_path(path) == tmp_path / "model.json"
    assert not list(tmp_path.glob(".*.tmp")), "temporary files left behind"
    embedded = checkpoint.safetensors_metadata(path.read_bytes())["gossipnet_model"]
    assert json.loads(embedded) == json.loads((tmp_path / "model.json").read_text())
    # a file never names code to import: your own model needs your factory
    assert "factory=" in one_line_error(path)
    loaded = load_model(path, factory=normalized)
    assert_same_state(state_of(loaded), state_of(module))
    assert float(loaded[1].num_batches_tracked) == 1 and not loaded.training
    sidecar_path(path).unlink()  # the description inside the file is enough
    assert_same_state(state_of(load_model(path, factory=normalized)), state_of(module))
    with pytest.raises(ValueError, match="device"):
        load_model(path, device="not-a-device", factory=normalized)
    with pytest.raises(ExportError, match=r"must not end in \.json"):
        save_model(tmp_path / "model.json", module, recipe)


def test_buffers_are_averaged_and_counters_keep_the_largest(tmp_path: Path) -> None:
    recipe = ModelRecipe("mymodel.py:normalized", (5,), 3)
    a, b = normalized((5,), 3), normalized((5,), 3)
    a(torch.randn(16, 5))
    for _ in range(3):
        b(torch.randn(16, 5) + 1)
    save_model(tmp_path / "a.st", a, recipe)
    save_model(tmp_path / "b.st", b, recipe)
    with pytest.raises(ExportError, match="factory="):
        average_models([tmp_path / "a.st", tmp_path / "b.st"], tmp_path / "avg.st")
    register_model("normalized-test", normalized, replace=True)
    try:
        registered = ModelRecipe("normalized-test", (5,), 3)
        save_model(tmp_path / "a.st", a, registered)
        save_model(tmp_path / "b.st", b, registered)
        average_models([tmp_path / "a.st", tmp_path / "b.st"], tmp_path / "avg.st")
        averaged = load_model(tmp_path / "avg.st")
    finally:
        del MODELS["normalized-test"]
    mean = (a[1].running_mean.double() + b[1].running_mean.double()).div(2).float()
    assert torch.equal(averaged[1].running_mean, mean)
    assert int(averaged[1].num_batches_tracked) == 3


async def batchnorm_checkpoint(folder: Path, peer_id: str, seed: int, shift: float) -> Peer:
    """A peer of a registered BatchNorm model (``normalized-test``) that trained alone on
    data shifted by ``shift``, averaging its buffers (the default), and checkpointed."""
    recipe = ModelRecipe("normalized-test", (5,), 3, seed=seed)
    g = torch.Generator().manual_seed(seed)
    batches = [
        (torch.randn(16, 5, generator=g) + shift, torch.randint(0, 3, (16,), generator=g))
        for _ in range(3)
    ]
    peer = Peer(
        recipe.build(),
        lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        torch.nn.functional.cross_entropy,
        batches,
        PeerConfig(peer_id=peer_id, checkpoint_dir=str(folder), secret=SECRET),
        recipe=recipe,
    )
    assert "1.running_mean" in peer.flat.layout.names  # in the flat vector, so gossiped
    await peer.start()
    await peer.run(steps=3 + seed)
    await peer.stop()
    return peer


async def test_a_batchnorm_peers_checkpoints_export_and_average_with_their_buffers(
    tmp_path: Path,
) -> None:
    """Checkpoint, load_model, --save-model and gossipnet export round-trip a BatchNorm
    model whose statistics ride in the flat vector: every tensor of its state_dict."""
    register_model("normalized-test", normalized, replace=True)
    try:
        a = await batchnorm_checkpoint(tmp_path / "peer-0.checkpoints", "a", seed=0, shift=0.0)
        b = await batchnorm_checkpoint(tmp_path / "peer-1.checkpoints", "b", seed=1, shift=3.0)
        a_state, b_state = state_of(a.model), state_of(b.model)
        assert (
            int(a_state["1.num_batches_tracked"]) == 3 and a_state["1.running_mean"].abs().sum() > 0
        )
        # a checkpoint folder loads as the peer's module, statistics and counter included
        assert_same_state(state_of(load_model(tmp_path / "peer-0.checkpoints")), a_state)
        # --save-model's file too
        with a.lock:
            saved = save_model(tmp_path / "a.safetensors", a.model, a.recipe, step=a.step)  # type: ignore[arg-type]
        assert_same_state(state_of(load_model(saved)), a_state)
        # gossipnet export of both: the swarm's average, statistics averaged too
        out = tmp_path / "swarm.safetensors"
        assert main([str(tmp_path / "peer-0.checkpoints"), str(tmp_path / "peer-1.checkpoints"),
                     "--out", str(out)]) == 0  # fmt: skip
        averaged = state_of(load_model(out))
    finally:
        del MODELS["normalized-test"]
    for name in ("1.running_mean", "1.running_var", "0.weight"):
        expected = (a_state[name].double() + b_state[name].double()).div(2).float()
        assert torch.equal(averaged[name], expected), name
    assert not torch.allclose(a_state["1.running_mean"], b_state["1.running_mean"], atol=0.1)
    assert int(averaged["1.num_batches_tracked"]) == 4  # the larger counter (b took 4 steps)


# --------------------------------------------------------------------------- hostile files


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    recipe = ModelRecipe("mlp:hidden=16", (10,), 3, dataset="synthetic", seed=1)
    return save_model(tmp_path / "good.safetensors", recipe.build(), recipe, step=3)


def rewrite(
    path: Path,
    *,
    document: dict[str, object] | None = None,
    tensors: dict[str, torch.Tensor] | None = None,
) -> None:
    """Replace the model file's description and/or tensors, consistently (a valid sha256,
    the same description inside and beside), as a careful attacker would."""
    from safetensors.torch import load

    tensors = load(path.read_bytes()) if tensors is None else tensors
    document = json.loads(sidecar_path(path).read_text()) if document is None else document
    document["sha256"] = checkpoint.tensor_digest(tensors)
    text = json.dumps(document)
    metadata = {"format": "gossipnet-model-1", "gossipnet_model": text}
    path.write_bytes(safetensors_save(tensors, metadata=metadata))
    sidecar_path(path).write_text(text)


def one_line_error(path: Path) -> str:
    with pytest.raises(ExportError) as info:
        load_model(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_truncated_file_is_one_line(model_file: Path) -> None:
    model_file.write_bytes(model_file.read_bytes()[:-40])
    assert "not a valid safetensors file" in one_line_error(model_file)
    model_file.write_bytes(b"\xff" * 8)
    assert "not a valid safetensors file" in one_line_error(model_file)


def test_an_unknown_model_is_refused(model_file: Path) -> None:
    document = json.loads(sidecar_path(model_file).read_text())
    document["model"] = {"spec": "no-such-model:width=3", "seed": 0}
    rewrite(model_file, document=document)
    message = one_line_error(model_file)
    assert "'no-such-model' is not a registered workloads model" in message
    assert "factory=" in message


@pytest.mark.parametrize("spec", ["{evil}:Net", "mlp:hidden=8,x={evil}:Net", "os:system"])
def test_a_file_never_makes_us_import_code(model_file: Path, spec: str) -> None:
    marker = model_file.parent / "imported"
    evil = model_file.parent / "evil.py"
    evil.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\nNet = None\n")
    document = json.loads(sidecar_path(model_file).read_text())
    document["model"] = {"spec": spec.format(evil=evil), "seed": 0}
    rewrite(model_file, document=document)
    assert "factory=" in one_line_error(model_file)
    assert not marker.exists()


def test_mismatched_shapes_are_named(model_file: Path) -> None:
    document = json.loads(sidecar_path(model_file).read_text())
    document["model"] = {"spec": "mlp:hidden=32", "seed": 0}
    rewrite(model_file, document=document)
    message = one_line_error(model_file)
    assert "tensor 'layers.1.weight' has shape (16, 10)" in message and "(32, 10)" in message


def test_a_huge_model_spec_is_refused_before_allocating(model_file: Path) -> None:
    document = json.loads(sidecar_path(model_file).read_text())
    document["model"] = {"spec": "mlp:hidden=1000000000", "seed": 0}  # 40 GB if built
    rewrite(model_file, document=document)
    assert "(1000000000, 10)" in one_line_error(model_file)


def test_tampered_tensors_fail_the_checksum(model_file: Path) -> None:
    data = bytearray(model_file.read_bytes())
    data[-3] ^= 0x40
    model_file.write_bytes(bytes(data))
    assert "do not match the sha256" in one_line_error(model_file)


def test_a_description_written_with_another_file_is_refused(model_file: Path) -> None:
    document = json.loads(sidecar_path(model_file).read_text())
    document["step"] = 99
    sidecar_path(model_file).write_text(json.dumps(document))
    assert "does not describe" in one_line_error(model_file)


@pytest.mark.parametrize(
    "text",
    [b"[" * 100_000, b'{"format": NaN}', b'{"format": "a", "format": "b"}', b"\xff\xfe", b"[]"],
)
def test_malformed_descriptions_are_one_line(model_file: Path, text: bytes) -> None:
    sidecar_path(model_file).write_bytes(text)
    one_line_error(model_file)


class _Tripwire:
    """Unpickling this touches a file: proof that a loader ran pickle."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[Path]]:
        return (Path.touch, (self.marker,))


def test_a_pickle_is_never_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    path = tmp_path / "model.safetensors"
    torch.save({"layers.1.weight": _Tripwire(marker)}, path)
    assert "not a valid safetensors file" in one_line_error(path)
    assert not marker.exists()
    checkpoint_file = checkpoint.checkpoint_path(tmp_path / "c", 1)
    checkpoint_file.parent.mkdir()
    torch.save({"flat": _Tripwire(marker)}, checkpoint_file)
    with pytest.raises(ExportError):
        load_model(checkpoint_file.parent)
    assert not marker.exists()


def test_the_export_module_names_the_model_file_api_as_the_same_objects() -> None:
    """``peer.app.export`` (the import path docs/models.md shows) names the model-file API
    as the very objects of the modules that own it."""
    owned = {
        **{name: getattr(model_file_module, name) for name in model_file_module.__all__},
        "ModelRecipe": ModelRecipe,
        "RECIPE_KEY": RECIPE_KEY,
        "average_models": average_models,
        "main": main,
    }
    assert set(export.__all__) <= set(owned)
    for name in export.__all__:
        assert getattr(export, name) is owned[name], name


# --------------------------------------------------------------------------- your own code

OWN_MODEL = (
    "import torch\n"
    "class Net(torch.nn.Sequential):\n"
    "    def __init__(self, input_shape, num_classes):\n"
    "        super().__init__(torch.nn.Linear(input_shape[0], num_classes))\n"
)


def test_a_model_of_your_code_is_reimported_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file records ``mymodel.py:Net`` (relative, as given) and load_model imports it
    from the current directory; elsewhere it says how to name the code, and a factory spec
    (``--model``) names it where it moved, which the export then records."""
    (tmp_path / "mymodel.py").write_text(OWN_MODEL)
    monkeypatch.chdir(tmp_path)
    spec = str(tmp_path / "mymodel.py") + ":Net"  # as a user may type it on --model
    recipe = ModelRecipe(spec, (3,), 2, dataset="data.npz")
    module = build_model(spec, (3,), 2)
    path = save_model(tmp_path / "net.safetensors", module, recipe)
    document = json.loads(sidecar_path(path).read_text())
    assert document["model"]["spec"] == "mymodel.py:Net"  # no machine path
    assert_same_state(state_of(load_model(path)), state_of(module))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    message = one_line_error(path)
    assert "factory=" in message and "--model FILE:FACTORY" in message
    assert "'mymodel.py' of the spec is not in the current directory" in message
    loaded = load_model(path, factory="../mymodel.py:Net")  # the user's own word: allowed
    assert_same_state(state_of(loaded), state_of(module))
    out = tmp_path / "elsewhere" / "moved.safetensors"
    assert main([str(path), "--out", str(out), "--model", "../mymodel.py:Net"]) == 0
    # the spec given climbs out of here: recorded by its name, found where the code is
    assert json.loads(sidecar_path(out).read_text())["model"]["spec"] == "mymodel.py:Net"
    monkeypatch.chdir(tmp_path)
    assert_same_state(state_of(load_model(out)), state_of(module))


def test_a_file_imports_code_only_from_inside_the_current_directory(
    model_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``..`` out of the current directory is refused, even with the file right there."""
    marker = model_file.parent / "imported"
    (model_file.parent / "evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\nNet = None\n"
    )
    (model_file.parent / "sub").mkdir()
    monkeypatch.chdir(model_file.parent / "sub")
    document = json.loads(sidecar_path(model_file).read_text())
    document["model"] = {"spec": "../evil.py:Net", "seed": 0}
    rewrite(model_file, document=document)
    assert "names a file outside it" in one_line_error(model_file)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("spec", "recorded"),
    [
        ("mnist1d:num_samples=400,cache_dir=/home/me/.cache/gossipnet", "mnist1d:num_samples=400"),
        ("mnist1d:cache_dir=/c", "mnist1d"),
        ("{here}/data/blobs.npz", "data/blobs.npz"),
        ("/somewhere/else/blobs.npz", "blobs.npz"),
        ("./data/../blobs.npz", "blobs.npz"),
        ("../up/blobs.npz", "blobs.npz"),
        ("npz:path={here}/blobs.npz,num_classes=3", "npz:path=blobs.npz,num_classes=3"),
        ("{here}/code/mymodel.py:Net", "code/mymodel.py:Net"),
        ("mypkg.models:make_net", "mypkg.models:make_net"),
        ("mlp:hidden=64", "mlp:hidden=64"),
    ],
)
def test_a_recipe_records_no_machine_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str, recorded: str
) -> None:
    monkeypatch.chdir(tmp_path)
    recipe = ModelRecipe("mlp", (3,), 2, dataset=spec.format(here=tmp_path))
    assert recipe.to_json()["data"]["dataset"] == recorded


async def test_export_of_a_run_folder_reads_each_honest_peers_model_file(tmp_path: Path) -> None:
    """``gossipnet export RUN`` on a ``launch --dir RUN --save-model`` folder: every peer's
    ``peer-N.safetensors``, else its newest checkpoint; not a Byzantine peer's model, not an
    average written there before, and not a peer twice."""
    recipe = ModelRecipe("mlp:hidden=8", (20,), 10, dataset=SYNTHETIC)
    honest, byzantine = recipe.build(), ModelRecipe("mlp:hidden=8", (20,), 10, seed=5).build()
    save_model(tmp_path / "peer-0.safetensors", honest, recipe, step=4, peer_id="peer-0")
    save_model(tmp_path / "peer-1.safetensors", byzantine, recipe, peer_id="peer-1",
               byzantine="sign-flip")  # fmt: skip
    checkpointed = await trained_checkpoint(tmp_path / "peer-2.checkpoints", "peer-2", seed=2)
    await trained_checkpoint(tmp_path / "peer-0.checkpoints", "peer-0", seed=3)  # has a file
    await trained_checkpoint(tmp_path / "peer-1.checkpoints", "peer-1", seed=4)  # Byzantine
    assert main([str(tmp_path), "--out", str(tmp_path / "swarm.safetensors")]) == 0
    assert main([str(tmp_path), "--out", str(tmp_path / "again.safetensors")]) == 0
    document = json.loads((tmp_path / "again.json").read_text())
    assert [(s["path"], s["peer_id"]) for s in document["averaged_from"]] == [
        ("peer-0.safetensors", "peer-0"),
        ("peer-2.checkpoints/checkpoint-000000000004.safetensors", "peer-2"),
    ]
    expected = {
        name: ((a.double() + b.double()) / 2).float()
        for (name, a), b in zip(
            state_of(honest).items(), state_of(checkpointed.model).values(), strict=True
        )
    }
    assert_same_state(state_of(load_model(tmp_path / "again.safetensors")), expected)
