"""The update rules: D-PSGD == all-reduce SGD where the math says so, sums preserved, CHOCO beats
naive compressed gossip, and every rule gives the same result batched and per node."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import msgpack
import numpy as np
import pytest
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from consensus import CoordinateWiseMedian, WeightedMean
from gossip.algorithms import (
    Choco,
    DecentralizedSGD,
    PushSum,
    RoundPlan,
    local_sgd,
)
from gossip.compression import build_compressor
from gossip.flat import FlatParameters, ParameterLayout
from gossip.pairwise import PairwiseGossip, ad_psgd, average_pair

from ._tables import (
    Table,
    complete_uniform,
    directed_exponential,
    ring_metropolis,
    synchronous_exchange,
    table_from_dense,
)

# ----------------------------------------------------------------------------- training setup

NODES = 4
BATCH = 12


@pytest.fixture(scope="module")
def data() -> tuple[Tensor, Tensor]:
    """A slice of MNIST-1D (Greydanus 2020), generated locally: 40 features, 10 classes."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = 300
    dataset = make_dataset(args)
    x = torch.as_tensor(dataset["x"], dtype=torch.float64)
    return (x - x.mean()) / x.std(), torch.as_tensor(dataset["y"], dtype=torch.int64)


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(40, 16), nn.Tanh(), nn.Linear(16, 10)).double()


def batch(data: tuple[Tensor, Tensor], node: int, count: int) -> tuple[Tensor, Tensor]:
    """Node ``node``'s ``count``-th minibatch: disjoint across nodes, fixed across runs."""
    x, y = data
    rows = ((count * NODES + node) * BATCH + torch.arange(BATCH)) % x.shape[0]
    return x[rows], y[rows]


class Batched:
    """The simulator's way: all nodes as one [n, d] parameter, gradients by vmap(grad)."""

    def __init__(self, model: nn.Module, data: tuple[Tensor, Tensor]) -> None:
        self.layout = ParameterLayout.from_module(model)
        self.data = data

        def loss(flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
            out = functional_call(model, self.layout.unflatten(flat), (x,))
            return nn.functional.cross_entropy(out, y)

        self.gradient = vmap(grad(loss))

    def gradients(self, models: Tensor, count: int) -> Tensor:
        batches = [batch(self.data, i, count) for i in range(models.shape[0])]
        xs = torch.stack([b[0] for b in batches])
        ys = torch.stack([b[1] for b in batches])
        return self.gradient(models, xs, ys)


def run_batched(
    algorithm: DecentralizedSGD | PushSum | Choco,
    table: Table,
    data: tuple[Tensor, Tensor],
    rounds: int,
    optimizer: Callable[[list[Tensor]], torch.optim.Optimizer],
) -> list[Tensor]:
    """Drive ``algorithm`` by its plan, all nodes at once; the models after every round."""
    model = make_model()
    start = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    parameter = nn.Parameter(start.expand(NODES, -1).clone())
    opt = optimizer([parameter])
    state = algorithm.init(parameter.data)
    batched = Batched(model, data)
    count = 0
    history = []
    for _ in range(rounds):
        for phase in algorithm.plan.phases():
            if phase == "gradient":
                parameter.grad = batched.gradients(algorithm.model(state), count)
                count += 1
            elif phase == "step":
                opt.step()
            else:
                synchronous_exchange(algorithm, state, table)
        history.append(algorithm.model(state).clone())
    return history


def run_per_node(
    make: Callable[[], DecentralizedSGD],
    table: Table,
    data: tuple[Tensor, Tensor],
    rounds: int,
    optimizer: Callable[[list[Tensor]], torch.optim.Optimizer],
) -> list[Tensor]:
    """The peer's way: one module per node, FlatParameters, real backward, payloads on a wire."""
    modules = [make_model() for _ in range(NODES)]
    flats = [FlatParameters(m) for m in modules]
    algorithms = [make() for _ in range(NODES)]
    states = [a.init(f.vector) for a, f in zip(algorithms, flats)]
    optimizers = [optimizer([f.parameter]) for f in flats]
    count = 0
    history = []
    for _ in range(rounds):
        for phase in algorithms[0].plan.phases():
            if phase == "gradient":
                for i, (module, flat) in enumerate(zip(modules, flats)):
                    flat.zero_grad()
                    x, y = batch(data, i, count)
                    nn.functional.cross_entropy(module(x), y).backward()
                count += 1
            elif phase == "step":
                for opt in optimizers:
                    opt.step()
            else:
                exchange_per_node(algorithms, states, table)
        history.append(
            torch.stack([a.model(s).detach().clone() for a, s in zip(algorithms, states)])
        )
    return history


def exchange_per_node(
    algorithms: list,
    states: list,
    table: Table,
    generator: torch.Generator | None = None,
) -> None:
    """Every node encodes its message, ships msgpack bytes, decodes its neighbours', combines."""
    messages = [a.message(s) for a, s in zip(algorithms, states)]
    width = messages[0].shape[-1]
    wire: list[bytes] = []
    own: list[Tensor] = []
    for algorithm, message in zip(algorithms, messages):
        payload, sent = algorithm.compressor.encode_and_decode(message, generator)
        wire.append(msgpack.packb(payload))
        own.append(sent)
    for i, (algorithm, state) in enumerate(zip(algorithms, states)):
        received = torch.stack(
            [
                algorithm.compressor.decode(msgpack.unpackb(wire[j]), width)
                for j in table.index[i].tolist()
            ]
        )
        algorithm.combine(
            state, own[i], received, table.weight[i], table.mask[i], table.self_weight[i]
        )


def sgd(momentum: float = 0.0) -> Callable[[list[Tensor]], torch.optim.Optimizer]:
    return lambda params: torch.optim.SGD(params, lr=0.2, momentum=momentum)


# ----------------------------------------------------------------------------- plans


def test_round_plan_phases() -> None:
    assert RoundPlan("adapt-then-combine", 1).phases() == ("gradient", "step", "exchange")
    assert RoundPlan("combine-then-adapt", 1).phases() == ("gradient", "exchange", "step")
    assert RoundPlan("adapt-then-combine", 2).phases() == (
        *("gradient", "step") * 2,
        "exchange",
    )
    assert RoundPlan("combine-then-adapt", 3).phases() == (
        "gradient",
        "exchange",
        "step",
        *("gradient", "step") * 2,
    )
    assert RoundPlan("combine-then-adapt", 0).phases() == ("exchange",)
    with pytest.raises(ValueError, match="order must be one of"):
        RoundPlan("sideways", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="local_steps must be an int >= 0, got -1"):
        RoundPlan("adapt-then-combine", -1)
    with pytest.raises(ValueError, match="consensus_step must be in"):
        Choco(build_compressor("none"), consensus_step=0.0)
    with pytest.raises(ValueError, match=r"compressor must be a gossip\.Compressor"):
        DecentralizedSGD(compressor="topk")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="floating-point tensor"):
        DecentralizedSGD().init(torch.arange(3))


# ----------------------------------------------------------------------------- D-PSGD


def all_reduce_sgd(data: tuple[Tensor, Tensor], rounds: int, momentum: float) -> list[Tensor]:
    """Synchronous data-parallel SGD: one model, gradient = mean of the nodes' gradients."""
    model = make_model()
    flat = FlatParameters(model)
    opt = sgd(momentum)([flat.parameter])
    history = []
    for count in range(rounds):
        total = torch.zeros_like(flat.grad)
        for i in range(NODES):
            flat.zero_grad()
            x, y = batch(data, i, count)
            nn.functional.cross_entropy(model(x), y).backward()
            total += flat.grad
        flat.grad.copy_(total / NODES)
        opt.step()
        history.append(flat.vector.clone())
    return history


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_atc_on_the_complete_graph_is_all_reduce_sgd_step_for_step(data, momentum) -> None:
    """x_i <- sum_j (1/n)(x_j - eta g_j(x_j)): every node holds the all-reduce iterate."""
    table = table_from_dense(complete_uniform(NODES))
    rounds = 6
    reference = all_reduce_sgd(data, rounds, momentum)
    batched = run_batched(
        DecentralizedSGD(order="adapt-then-combine"), table, data, rounds, sgd(momentum)
    )
    per_node = run_per_node(
        lambda: DecentralizedSGD(order="adapt-then-combine"), table, data, rounds, sgd(momentum)
    )
    start = torch.cat([p.detach().reshape(-1) for p in make_model().parameters()])
    for t in range(rounds):
        assert torch.allclose(batched[t], reference[t].expand(NODES, -1), rtol=0, atol=1e-12)
        assert torch.allclose(per_node[t], batched[t], rtol=0, atol=1e-12)
    assert (reference[-1] - start).norm() > 0.1  # it did train


def test_cta_follows_lian_et_al_and_matches_all_reduce_on_its_first_step(data) -> None:
    """CTA: X_{t+1} = W X_t - eta G(X_t) (gradient at the pre-mixing model), checked against
    the dense matrix recursion. On the complete graph the nodes' mean after the first step is
    the all-reduce step; later it is not (each gradient is taken at that node's own model),
    which is why the exact all-reduce equivalence is an ATC property."""
    w = complete_uniform(NODES)
    table = table_from_dense(w)
    rounds = 5
    batched = run_batched(DecentralizedSGD(), table, data, rounds, sgd())
    per_node = run_per_node(DecentralizedSGD, table, data, rounds, sgd())
    model = make_model()
    gradients = Batched(model, data)
    x = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).expand(NODES, -1)
    w_t = torch.as_tensor(w)
    for t in range(rounds):
        x = w_t @ x - 0.2 * gradients.gradients(x, t)
        assert torch.allclose(batched[t], x, rtol=0, atol=1e-12)
        assert torch.allclose(per_node[t], x, rtol=0, atol=1e-12)
    reference = all_reduce_sgd(data, rounds, 0.0)
    assert torch.allclose(batched[0].mean(0), reference[0], rtol=0, atol=1e-12)
    assert not torch.allclose(batched[-1].mean(0), reference[-1], rtol=0, atol=1e-6)


def test_local_sgd_takes_h_local_steps_then_averages(data) -> None:
    """ATC with H = 3 on the complete graph: each node runs 3 SGD steps alone, then all average."""
    table = table_from_dense(complete_uniform(NODES))
    algorithm = local_sgd(3)
    assert algorithm.plan.phases().count("step") == 3
    batched = run_batched(algorithm, table, data, 2, sgd())
    per_node = run_per_node(lambda: local_sgd(3), table, data, 2, sgd())
    model = make_model()
    flat = FlatParameters(model)
    x = flat.vector.clone()
    count = 0
    for r in range(2):
        ends = []
        for i in range(NODES):
            flat.load_(x)
            opt = sgd()([flat.parameter])
            for h in range(3):
                flat.zero_grad()
                xb, yb = batch(data, i, count + h)
                nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
            ends.append(flat.vector.clone())
        count += 3
        x = torch.stack(ends).mean(0)
        assert torch.allclose(batched[r], x.expand(NODES, -1), rtol=0, atol=1e-12)
        assert torch.allclose(per_node[r], batched[r], rtol=0, atol=1e-12)


def test_adam_kept_per_node_is_the_same_batched_and_per_node(data) -> None:
    """An [n, d] Adam in the simulator is n per-node Adams (element-wise state)."""
    table = table_from_dense(ring_metropolis(NODES))

    def adam(params: list[Tensor]) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=0.01)

    batched = run_batched(DecentralizedSGD(), table, data, 4, adam)
    per_node = run_per_node(DecentralizedSGD, table, data, 4, adam)
    for mine, theirs in zip(batched, per_node):
        assert torch.allclose(mine, theirs, rtol=0, atol=1e-12)
    assert not torch.allclose(batched[-1][0], batched[-1][1], atol=1e-6)  # nodes differ on a ring


def test_choco_sgd_without_compression_and_full_step_is_dpsgd(data) -> None:
    """Q = identity, gamma = 1: x̂ = x after every exchange, so CHOCO-SGD is D-PSGD (ATC)."""
    table = table_from_dense(ring_metropolis(NODES))
    choco = run_batched(
        Choco(build_compressor("none"), consensus_step=1.0), table, data, 4, sgd(0.9)
    )
    dpsgd = run_batched(DecentralizedSGD(order="adapt-then-combine"), table, data, 4, sgd(0.9))
    for mine, theirs in zip(choco, dpsgd):
        assert torch.allclose(mine, theirs, rtol=0, atol=1e-12)


def test_robust_aggregator_hook_survives_a_byzantine_neighbour() -> None:
    """The same D-PSGD with consensus rules swapped in: a node sending 1e6 drags the mean
    away, the coordinate-wise median keeps honest nodes inside the honest range."""
    n, d = 7, 20
    table = table_from_dense(complete_uniform(n))
    start = torch.randn(n, d, dtype=torch.float64)
    results = {}
    for name, rule in [("mean", WeightedMean()), ("median", CoordinateWiseMedian())]:
        algorithm = DecentralizedSGD(aggregator=rule, order="adapt-then-combine")
        state = algorithm.init(start.clone())
        for _ in range(5):
            sent = algorithm.message(state).clone()
            sent[0] = 1e6  # node 0 is Byzantine
            algorithm.combine(state, sent, sent[table.index], table.weight, table.mask)
        results[name] = state.x[1:]
    honest = start[1:]
    assert results["mean"].abs().max() > 1e4
    assert bool((results["median"] <= honest.max(0).values).all())
    assert bool((results["median"] >= honest.min(0).values).all())


# ----------------------------------------------------------------------------- pairwise


def test_pairwise_gossip_preserves_the_sum_and_converges_to_the_average() -> None:
    n, d = 10, 6
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(n, d, dtype=torch.float64, generator=generator)
    total, average = x.sum(0), x.mean(0)
    for _ in range(300):
        order = torch.randperm(n, generator=generator)
        pairs = order[: 2 * (n // 2)].reshape(-1, 2)
        PairwiseGossip().exchange(x, pairs)
        assert torch.allclose(x.sum(0), total, rtol=0, atol=1e-12)
    assert torch.allclose(x, average.expand(n, -1), rtol=0, atol=1e-12)


def test_pair_averaging_is_exact_on_dyadic_values_and_both_sides_agree() -> None:
    a = torch.tensor([1.0, 2.5, -3.0])
    b = torch.tensor([3.0, 0.5, 4.0])
    assert torch.equal(average_pair(a, b), torch.tensor([2.0, 1.5, 0.5]))
    assert torch.equal(average_pair(a, b), average_pair(b, a))


def test_matching_batched_equals_pair_by_pair_and_equals_dpsgd_on_the_matching_table() -> None:
    n, d = 8, 5
    x = torch.randn(n, d, dtype=torch.float64)
    pairs = torch.tensor([[0, 5], [3, 1], [7, 2]])
    batched = PairwiseGossip().exchange(x.clone(), pairs)
    per_pair = x.clone()
    for a, b in pairs.tolist():
        per_pair[a] = per_pair[b] = average_pair(x[a], x[b])
    assert torch.equal(batched, per_pair)
    assert torch.equal(batched[[4, 6]], x[[4, 6]])  # unmatched nodes keep their model
    w = np.eye(n)
    for a, b in pairs.tolist():
        w[a, a] = w[b, b] = w[a, b] = w[b, a] = 0.5
    algorithm = ad_psgd()
    assert algorithm.plan.phases() == ("gradient", "exchange", "step")
    state = algorithm.init(x.clone())
    synchronous_exchange(algorithm, state, table_from_dense(w))
    assert torch.allclose(state.x, batched, rtol=0, atol=1e-15)


def test_pairwise_exchange_refuses_overlapping_or_out_of_range_pairs() -> None:
    x = torch.zeros(4, 2)
    with pytest.raises(ValueError, match="disjoint"):
        PairwiseGossip().exchange(x, torch.tensor([[0, 1], [1, 2]]))
    with pytest.raises(ValueError, match=r"index nodes in \[0, 4\)"):
        PairwiseGossip().exchange(x, torch.tensor([[0, 4]]))
    with pytest.raises(ValueError, match=r"shape \[m, 2\]"):
        PairwiseGossip().exchange(x, torch.tensor([0, 1]))


# ----------------------------------------------------------------------------- push-sum


def asymmetric_column_stochastic(n: int, seed: int) -> np.ndarray:
    """A directed ring plus random extra links; each sender splits its mass equally over
    itself and its out-neighbours, so columns sum to 1 and rows do not."""
    rng = np.random.default_rng(seed)
    links = np.eye(n, dtype=bool) | np.roll(np.eye(n, dtype=bool), 1, axis=0)
    links |= rng.random((n, n)) < 0.25
    return links / links.sum(axis=0, keepdims=True)


@pytest.mark.parametrize("graph", ["directed-exponential", "asymmetric"])
def test_push_sum_preserves_mass_and_converges_to_the_exact_average(graph: str) -> None:
    n, d = 12, 7
    p = (
        directed_exponential(n)
        if graph == "directed-exponential"
        else asymmetric_column_stochastic(n, 1)
    )
    assert np.allclose(p.sum(axis=0), 1.0)
    if graph == "asymmetric":
        assert not np.allclose(p.sum(axis=1), 1.0)
    table = table_from_dense(p)
    start = torch.randn(n, d, dtype=torch.float64)
    algorithm = PushSum(local_steps=0)
    state = algorithm.init(start.clone())
    for _ in range(80):
        synchronous_exchange(algorithm, state, table)
        assert torch.allclose(state.x.sum(0), start.sum(0), rtol=0, atol=1e-12)
        assert abs(float(state.weight.sum()) - n) < 1e-12
    assert torch.allclose(state.z, start.mean(0).expand(n, -1), rtol=0, atol=1e-10)
    if graph == "asymmetric":
        # the weights are far from 1, so x alone is not the average: the de-biasing matters
        assert float((state.weight - 1).abs().max()) > 0.1
        assert not torch.allclose(state.x, start.mean(0).expand(n, -1), atol=1e-3)


def test_push_sum_on_the_topologies_package_graphs() -> None:
    """With ``topologies``' tables: the static directed exponential graph reaches the exact
    average, and the time-varying one-peer exponential graph (Assran et al. 2019) reaches it
    exactly in log2(n) rounds."""
    import topologies

    start = torch.randn(12, 5, dtype=torch.float64)
    algorithm = PushSum(local_steps=0)
    state = algorithm.init(start.clone())
    table = topologies.neighbour_table(topologies.mixing_matrix(topologies.exponential(12)))
    for _ in range(60):
        synchronous_exchange(algorithm, state, table)
    assert torch.allclose(state.z, start.mean(0).expand(12, -1), rtol=0, atol=1e-12)

    start = torch.randn(16, 5, dtype=torch.float64)
    state = algorithm.init(start.clone())
    schedule = topologies.OnePeerExponential(16)
    for t in range(4):
        synchronous_exchange(algorithm, state, schedule.neighbour_table(t))
    assert torch.allclose(state.z, start.mean(0).expand(16, -1), rtol=0, atol=1e-14)


def test_push_sum_local_step_moves_the_numerator_like_stochastic_gradient_push() -> None:
    """SGP: x <- x - eta g(z). The optimizer steps z in place; message() folds it into x."""
    p = asymmetric_column_stochastic(6, 2)
    algorithm = PushSum()
    state = algorithm.init(torch.randn(6, 4, dtype=torch.float64))
    synchronous_exchange(algorithm, state, table_from_dense(p))
    x_before = state.x.clone()
    step = torch.randn(6, 4, dtype=torch.float64)
    algorithm.model(state).sub_(step)  # what optimizer.step() does to the module
    message = algorithm.message(state)
    assert torch.allclose(state.x, x_before - step, rtol=0, atol=1e-12)
    assert torch.equal(message[:, :4], state.x) and torch.equal(message[:, 4:], state.weight)


# ----------------------------------------------------------------------------- CHOCO


def consensus_errors(
    algorithm, start: Tensor, table: Table, rounds: int, every: int
) -> list[float]:
    """(1/n) sum_i ||x_i - mean(x_0)||^2 relative to its start value, every ``every`` rounds."""
    state = algorithm.init(start.clone())
    average = start.mean(0)
    initial = float(((start - average) ** 2).sum(1).mean())
    generator = torch.Generator().manual_seed(0)
    errors = []
    for t in range(rounds + 1):
        if t % every == 0:
            errors.append(float(((algorithm.model(state) - average) ** 2).sum(1).mean()) / initial)
        synchronous_exchange(algorithm, state, table, generator=generator)
    return errors


@pytest.mark.parametrize(
    ("spec", "gamma", "rounds", "every", "final", "window"),
    [("topk:ratio=0.01", 0.05, 2400, 400, 1e-5, 0.5), ("qsgd:bits=8", 0.8, 300, 50, 1e-10, 0.1)],
)
def test_choco_gossip_converges_geometrically_where_naive_compressed_gossip_stalls(
    spec, gamma, rounds, every, final, window
) -> None:
    """Ring of 16, d = 1000. CHOCO-Gossip's error falls by a constant factor every window;
    plain gossip that mixes Q(x_j) directly plateaus: top-k forgets most of each neighbour's
    model, quantization noise scales with |x| rather than with the disagreement."""
    n, d = 16, 1000
    table = table_from_dense(ring_metropolis(n))
    start = torch.randn(n, d, dtype=torch.float64)
    choco = consensus_errors(
        Choco(build_compressor(spec), consensus_step=gamma, local_steps=0),
        start,
        table,
        rounds,
        every,
    )
    naive = consensus_errors(
        DecentralizedSGD(local_steps=0, compressor=build_compressor(spec)),
        start,
        table,
        rounds,
        every,
    )
    ratios = [later / earlier for earlier, later in itertools.pairwise(choco)]
    assert max(ratios) < window, ratios
    assert choco[-1] < final
    half = len(naive) // 2
    assert naive[-1] > 0.5 * naive[half], naive  # no progress over the second half
    assert naive[-1] > 1e3 * choco[-1]


def test_choco_keeps_the_network_average() -> None:
    n, d = 16, 200
    table = table_from_dense(ring_metropolis(n))
    start = torch.randn(n, d, dtype=torch.float64)
    algorithm = Choco(build_compressor("randk:ratio=0.1"), consensus_step=0.1, local_steps=0)
    state = algorithm.init(start.clone())
    generator = torch.Generator().manual_seed(1)
    for _ in range(50):
        synchronous_exchange(algorithm, state, table, generator=generator)
        assert torch.allclose(state.x.mean(0), start.mean(0), rtol=0, atol=1e-12)


def star_metropolis(n: int) -> np.ndarray:
    """Star, node 0 in the centre, Metropolis-Hastings weights 1/n (leaves are padded to k=n-1)."""
    w = np.zeros((n, n))
    w[0, 1:] = w[1:, 0] = 1.0 / n
    np.fill_diagonal(w, 1.0 - w.sum(1))
    return w


def test_choco_public_copies_stay_in_step_with_padded_tables() -> None:
    """sum_j W_ij x̂_j (kept incrementally) equals W x̂ recomputed, and the average is kept."""
    n, d = 6, 40
    w = star_metropolis(n)
    table = table_from_dense(w)
    assert not bool(table.mask.all())  # leaves carry padding (mask False, weight 0)
    algorithm = Choco(build_compressor("topk:ratio=0.1"), consensus_step=0.3, local_steps=0)
    start = torch.randn(n, d, dtype=torch.float64)
    state = algorithm.init(start.clone())
    generator = torch.Generator().manual_seed(4)
    for _ in range(30):
        synchronous_exchange(algorithm, state, table, generator=generator)
    recomputed = torch.from_numpy(w) @ state.public
    assert torch.allclose(state.public_mix, recomputed, rtol=0, atol=1e-12)
    assert torch.allclose(state.x.mean(0), start.mean(0), rtol=0, atol=1e-12)


def _late_sums(table, sent, lost):  # type: ignore[no-untyped-def]
    """``sum_j W_ij m_j`` over the lost slots: what a runner hands to ``late`` next round."""
    index = torch.as_tensor(table.index, dtype=torch.long)
    weights = torch.as_tensor(table.weight, dtype=sent.dtype)
    return (torch.where(lost, weights, 0.0).unsqueeze(-1) * sent[index]).sum(dim=1)


@pytest.mark.parametrize(
    "codec", ["none", "qsgd:bits=4", "topk:ratio=0.3", "chunked-topk:chunk=4,k=2"]
)
def test_choco_late_increment_restores_copies_and_average(codec: str) -> None:
    """A message that misses its round arrives at the next one: after ``late`` every public
    copy sum and the network average equal those of on-time delivery (Choco's docstring)."""
    n, d, rounds = 6, 10, 4
    table = table_from_dense(star_metropolis(n))
    w = star_metropolis(n)
    start = torch.randn(n, d, dtype=torch.float64)
    algorithm = Choco(build_compressor(codec), consensus_step=0.5, local_steps=0)
    state = algorithm.init(start.clone())
    generator = torch.Generator().manual_seed(0)
    lost = torch.zeros(table.mask.shape, dtype=torch.bool)
    lost[3, 0] = True  # leaf 3 misses the centre's increment in round 0
    late = None
    for t in range(rounds):
        if late is not None:
            algorithm.late(state, late, late)  # one round late
            late = None
        message = algorithm.message(state)
        sent = algorithm.compressor.compress(message, generator).values
        mask = torch.as_tensor(table.mask) & ~(lost if t == 0 else torch.zeros_like(lost))
        index = torch.as_tensor(table.index, dtype=torch.long)
        weights = torch.as_tensor(table.weight, dtype=sent.dtype)
        if t == 0:
            late = _late_sums(table, sent, lost)
            before = state.public_mix.clone()
        algorithm.combine(state, sent, sent[index], weights, mask)
        if t == 0:  # leaf 3's copy of the centre is behind this round
            assert not torch.allclose(state.public_mix[3], (torch.from_numpy(w) @ state.public)[3])
            expected = before + torch.from_numpy(w) @ sent  # the centre heard everyone
            assert torch.allclose(state.public_mix[0], expected[0], rtol=0, atol=1e-12)
    # every increment has arrived: the copies agree and the average is the start's
    recomputed = torch.from_numpy(w) @ state.public
    assert torch.allclose(state.public_mix, recomputed, rtol=0, atol=1e-12)
    assert torch.allclose(state.x.mean(0), start.mean(0), rtol=0, atol=1e-12)


def test_push_sum_late_mass_is_added_so_the_total_is_conserved() -> None:
    n, d = 5, 4
    algorithm = PushSum(local_steps=0)
    p = np.full((n, n), 0.0)
    for i in range(n):  # column-stochastic: each node keeps half, sends half to i + 1
        p[i, i] = 0.5
        p[(i + 1) % n, i] = 0.5
    table = table_from_dense(p)
    state = algorithm.init(torch.randn(n, d, dtype=torch.float64))
    total = state.x.sum(0).clone()
    message = algorithm.message(state)
    index = torch.as_tensor(table.index, dtype=torch.long)
    weights = torch.as_tensor(table.weight, dtype=message.dtype)
    lost = torch.zeros(table.mask.shape, dtype=torch.bool)
    lost[2, 0] = True
    mask = torch.as_tensor(table.mask) & ~lost
    self_weight = torch.as_tensor(table.self_weight, dtype=message.dtype)
    algorithm.combine(state, message, message[index], weights, mask, self_weight)
    assert not torch.allclose(state.x.sum(0), total)  # the lost mass is missing ...
    algorithm.late(state, _late_sums(table, message, lost), _late_sums(table, message, lost))
    assert torch.allclose(state.x.sum(0), total, atol=1e-12)  # ... until it arrives
    assert torch.allclose(state.weight.sum(), torch.tensor(float(n), dtype=torch.float64))
    assert torch.equal(state.z, state.x / state.weight)


def test_a_late_model_is_dropped_by_dpsgd() -> None:
    algorithm = DecentralizedSGD()
    state = algorithm.init(torch.randn(3, 4))
    before = state.x.clone()
    algorithm.late(state, torch.ones(3, 4), torch.ones(3, 4))
    assert torch.equal(state.x, before)


# ----------------------------------------------------------------------------- batched == per node

RULES: dict[str, tuple[Callable[[], object], str]] = {
    "dpsgd-mean": (lambda: DecentralizedSGD(), "ring"),
    "dpsgd-median": (lambda: DecentralizedSGD(aggregator=CoordinateWiseMedian()), "ring"),
    "dpsgd-topk-feedback": (
        lambda: DecentralizedSGD(compressor=build_compressor("topk:ratio=0.1,feedback=true")),
        "ring",
    ),
    "dpsgd-bf16": (lambda: DecentralizedSGD(compressor=build_compressor("bf16")), "ring"),
    "push-sum": (lambda: PushSum(), "asymmetric"),
    "push-sum-fp16": (lambda: PushSum(compressor=build_compressor("fp16")), "exponential"),
    "choco-qsgd": (
        lambda: Choco(build_compressor("qsgd:bits=4,block=16"), consensus_step=0.5),
        "ring",
    ),
    "choco-topk": (lambda: Choco(build_compressor("topk:ratio=0.2"), consensus_step=0.2), "ring"),
    "choco-randk": (lambda: Choco(build_compressor("randk:ratio=0.2"), consensus_step=0.2), "ring"),
    "choco-chunked-topk": (
        lambda: Choco(build_compressor("chunked-topk:chunk=8,k=2"), consensus_step=0.2),
        "ring",
    ),
}


@pytest.mark.parametrize("rule", list(RULES))
def test_batched_equals_per_node(rule: str) -> None:
    """The simulator's batched call and n peers' unbatched calls over msgpack agree."""
    make, graph = RULES[rule]
    n, d = 9, 33
    matrix = {
        "ring": ring_metropolis(n),
        "asymmetric": asymmetric_column_stochastic(n, 4),
        "exponential": directed_exponential(n),
    }[graph]
    table = table_from_dense(matrix)
    start = torch.randn(n, d)
    batched_algorithm = make()
    batched_state = batched_algorithm.init(start.clone())  # type: ignore[attr-defined]
    peers = [make() for _ in range(n)]
    peer_states = [peer.init(start[i].clone()) for i, peer in enumerate(peers)]  # type: ignore[attr-defined]
    batched_generator = torch.Generator().manual_seed(7)
    peer_generator = torch.Generator().manual_seed(7)
    for step in range(6):
        # a local step in between exchanges, identical on both sides
        drift = torch.randn(n, d, generator=torch.Generator().manual_seed(100 + step)) * 0.1
        batched_algorithm.model(batched_state).add_(drift)  # type: ignore[attr-defined]
        for i, (peer, state) in enumerate(zip(peers, peer_states)):
            peer.model(state).add_(drift[i])  # type: ignore[attr-defined]
        synchronous_exchange(batched_algorithm, batched_state, table, generator=batched_generator)  # type: ignore[arg-type]
        exchange_per_node(peers, peer_states, table, peer_generator)
    batched_model = batched_algorithm.model(batched_state)  # type: ignore[attr-defined]
    per_node = torch.stack([p.model(s) for p, s in zip(peers, peer_states)])  # type: ignore[attr-defined]
    assert torch.allclose(batched_model, per_node, rtol=0, atol=1e-5)
    assert not torch.allclose(batched_model, start, atol=1e-3)  # something happened


def test_late_messages_fold_their_weight_into_the_self_weight() -> None:
    """mask False (missed the deadline): rows stay stochastic, so agreement is kept, a node
    that heard nobody keeps its model, and the peer's unbatched call agrees with the batch."""
    n, d = 8, 4
    table = table_from_dense(ring_metropolis(n))
    delivered = (
        torch.rand(n, table.index.shape[1], generator=torch.Generator().manual_seed(2)) < 0.5
    )
    delivered[3] = False
    algorithm = DecentralizedSGD()
    agreed = algorithm.init(torch.full((n, d), 2.5, dtype=torch.float64))
    synchronous_exchange(algorithm, agreed, table, delivered=delivered)
    assert torch.allclose(agreed.x, torch.full((n, d), 2.5, dtype=torch.float64), atol=1e-15)
    start = torch.randn(n, d, dtype=torch.float64)
    batched = algorithm.init(start.clone())
    synchronous_exchange(algorithm, batched, table, delivered=delivered)
    assert torch.equal(batched.x[3], start[3])
    for i in range(n):
        peer = algorithm.init(start[i].clone())
        mask = table.mask[i] & delivered[i]
        algorithm.combine(peer, start[i], start[table.index[i]], table.weight[i], mask)
        assert torch.allclose(peer.x, batched.x[i], rtol=0, atol=1e-15)


def test_exchange_reports_the_wire_bytes_of_each_message() -> None:
    n, d = 6, 50
    table = table_from_dense(ring_metropolis(n))
    codec = build_compressor("qsgd:bits=4")
    algorithm = DecentralizedSGD(compressor=codec)
    state = algorithm.init(torch.randn(n, d))
    payload = codec.encode(torch.randn(d))
    assert synchronous_exchange(algorithm, state, table) == len(msgpack.packb(payload))
    push = PushSum(compressor=build_compressor("none"))
    push_state = push.init(torch.randn(n, d))
    assert synchronous_exchange(push, push_state, table) == push.compressor.wire_bytes(d + 1)


def test_push_sum_leaves_out_messages_with_a_weight_that_is_not_positive() -> None:
    """A hostile member's message with w <= 0 (or NaN) is treated as missing, in both
    runners (the rule is shared): the receiver's weight stays positive."""
    algorithm = PushSum(local_steps=0)
    state = algorithm.init(torch.ones(4, dtype=torch.float64))
    sent = algorithm.message(state)
    received = torch.stack([sent, sent.clone(), sent.clone()])
    received[1, -1] = -5.0
    received[2, -1] = float("nan")
    weights = torch.tensor([0.25, 0.25, 0.25], dtype=torch.float64)
    algorithm.combine(state, sent, received, weights, None, torch.tensor(0.25))
    assert float(state.weight) == pytest.approx(0.5)  # own 0.25 + the one valid 0.25
    assert torch.isfinite(state.z).all()
    algorithm.late(state, torch.full((5,), -3.0, dtype=torch.float64), torch.zeros(5))
    assert float(state.weight) == pytest.approx(0.5)  # a negative late mass is skipped
