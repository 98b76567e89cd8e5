"""FedProx, SCAFFOLD and FedADMM on problems whose answers are known."""

import numpy as np
import pytest
import torch

from taciturn.algorithms.base import Arrival
from taciturn.algorithms.fedadmm import FedADMM, FedADMMConfig
from taciturn.algorithms.fedavg import FedAvg, FedAvgConfig
from taciturn.algorithms.fedprox import FedProx, FedProxConfig
from taciturn.algorithms.scaffold import Scaffold, ScaffoldConfig
from taciturn.core import Message
from tests.conftest import capture_uplinks, tiny_config
from tests.quadratic import ExactXUpdate, federation, least_squares_data, optimum, run, start

FULL_BATCH = {"steps": 10, "batch_size": 10_000, "lr": 0.02}


def test_fedprox_with_mu_zero_is_fedavg_bit_for_bit(tmp_path):
    from taciturn.core.rng import SERVER
    from taciturn.experiments.runner import prepare

    results = []
    for algorithm in ({"name": "fedavg"}, {"name": "fedprox", "mu": 0.0}):
        exp = prepare(
            tiny_config(algorithm={**algorithm, "fraction": 0.5, "local": {"momentum": 0.9}}), tmp_path
        )
        state = exp.algorithm.init_server(exp.task.init_params(exp.streams.torch(0, SERVER, "init")), 8)
        for r in (1, 2, 3):
            state, _ = exp.federation.run_round(state, r)
        results.append(state.params)
    assert all(torch.equal(results[0][k], results[1][k]) for k in results[0])


def test_fedprox_objective_is_loss_plus_proximal_term():
    algorithm = FedProx(FedProxConfig(mu=0.5))
    params = {"w": torch.tensor([1.0, 2.0])}
    anchor = {"w": torch.tensor([0.0, 4.0])}
    value = algorithm.objective(lambda p, b: torch.tensor(3.0), params, None, {"anchor": anchor})
    assert float(value) == pytest.approx(3.0 + 0.25 * (1 + 4))


def test_fedavg_drifts_under_heterogeneity_and_scaffold_does_not():
    data = least_squares_data()
    target = optimum(data)
    fedavg = FedAvg(FedAvgConfig(fraction=1.0, local=FULL_BATCH))
    drifted = run(federation(fedavg, data), start(fedavg, data), 100).params["w"]
    assert torch.linalg.norm(drifted - target) > 0.1  # FedAvg's fixed point is not the optimum

    # Plain-SGD SCAFFOLD (both options) and SCAFFOLD with momentum all reach the optimum.
    for option, momentum in (("II", 0.0), ("I", 0.0), ("II", 0.5)):
        scaffold = Scaffold(
            ScaffoldConfig(fraction=1.0, option=option, local={**FULL_BATCH, "momentum": momentum})
        )
        reached = run(federation(scaffold, data), start(scaffold, data), 100).params["w"]
        torch.testing.assert_close(
            reached, target, rtol=0, atol=1e-5, msg=f"option {option}, momentum {momentum}"
        )


def test_scaffold_uniform_weighting_targets_the_uniform_objective():
    data = least_squares_data()
    scaffold = Scaffold(ScaffoldConfig(fraction=1.0, local=FULL_BATCH, weighting="uniform"))
    reached = run(federation(scaffold, data), start(scaffold, data), 100).params["w"]
    torch.testing.assert_close(reached, optimum(data, uniform=True), rtol=0, atol=1e-6)


def test_scaffold_with_partial_participation_keeps_c_the_mean_of_client_variates():
    data = least_squares_data()
    scaffold = Scaffold(ScaffoldConfig(fraction=0.4, local={**FULL_BATCH, "momentum": 0.3}))
    fed = federation(scaffold, data)
    state = run(fed, start(scaffold, data), 40)
    weights = [data.client_size(c) / data.num_samples for c in range(5)]
    mean_ci = sum(
        w * fed.executor.pipeline.store.get(c)["c/w"]
        for c, w in enumerate(weights)
        if fed.executor.pipeline.store.get(c) is not None
    )
    torch.testing.assert_close(state.control["w"], mean_ci, rtol=0, atol=1e-10)


def test_scaffold_option_two_equals_the_paper_formula_for_plain_sgd():
    """With plain SGD, the mean gradient taken is c_i - c + (x - y) / (K lr) exactly."""
    data = least_squares_data()
    scaffold = Scaffold(ScaffoldConfig(fraction=1.0, local=FULL_BATCH))
    fed = federation(scaffold, data)
    state = run(fed, start(scaffold, data), 3)  # non-zero c and c_i by now
    before = {c: fed.executor.pipeline.store.get(c)["c/w"].clone() for c in range(5)}
    x, c = state.params["w"].clone(), state.control["w"].clone()
    captured = capture_uplinks(scaffold)
    fed.run_round(state, 4)
    for client, msg in captured.items():
        y = x + msg["dy/w"]
        paper = before[client] - c + (x - y) / (10 * FULL_BATCH["lr"])
        torch.testing.assert_close(before[client] + msg["dc/w"], paper, rtol=1e-9, atol=1e-9)


def test_scaffold_messages_carry_two_vectors_each_way():
    """Exact bytes: the ledger counts every encoded message, and each SCAFFOLD message carries two
    float64 3-vectors (48 bytes of array data) where FedAvg's carries one (24)."""
    import struct

    from taciturn.core import Direction, encode

    data = least_squares_data()
    for algorithm, payload in (
        (Scaffold(ScaffoldConfig(fraction=1.0, local=FULL_BATCH)), 48),
        (FedAvg(FedAvgConfig(fraction=1.0, local=FULL_BATCH)), 24),
    ):
        fed = federation(algorithm, data)
        channel, sent = fed.executor.pipeline.channel, {d: [] for d in Direction}
        original = channel.send

        def send(direction, round, client, message, original=original, sent=sent):
            sent[direction].append(encode(message))
            return original(direction, round, client, message)

        channel.send = send
        run(fed, start(algorithm, data), 1)
        for d in Direction:
            totals = channel.ledger.totals(d)
            assert totals.messages_sent == len(sent[d]) == 5
            assert totals.bytes_sent == sum(len(blob) for blob in sent[d])
            for blob in sent[d]:  # safetensors: 8-byte header length, JSON header, array data
                (header,) = struct.unpack("<Q", blob[:8])
                assert len(blob) - 8 - header == payload


def test_fedadmm_server_averages_over_all_clients_with_stale_copies():
    algorithm = FedADMM(FedADMMConfig(fraction=0.5))
    z0 = {"w": torch.tensor([1.0, 1.0])}
    state = algorithm.init_server(z0, 4)

    def vec(values):
        return Message({"w": np.array(values, np.float32)})

    state = algorithm.aggregate(state, 1, [Arrival(1, vec([5.0, 1.0])), Arrival(3, vec([1.0, 9.0]))])
    torch.testing.assert_close(state.z["w"], torch.tensor([(1 + 5 + 1 + 1) / 4, (1 + 1 + 1 + 9) / 4]))
    state = algorithm.aggregate(state, 2, [Arrival(1, vec([1.0, 1.0]))])  # client 3's copy stays
    torch.testing.assert_close(state.z["w"], torch.tensor([1.0, 3.0]))


class ExactFedADMM(ExactXUpdate, FedADMM):
    pass


def test_fedadmm_converges_to_the_consensus_optimum_on_least_squares():
    """One rho for every agent: ADMM solves min sum_i f_i, the uniform objective."""
    data = least_squares_data()
    algorithm = ExactFedADMM(FedADMMConfig(fraction=1.0, rho=2.0))
    reached = run(federation(algorithm, data), start(algorithm, data), 200).z["w"]
    torch.testing.assert_close(reached, optimum(data, uniform=True), rtol=0, atol=1e-8)


def test_fedadmm_with_sgd_x_updates_approaches_the_optimum():
    data = least_squares_data()
    algorithm = FedADMM(FedADMMConfig(fraction=1.0, rho=2.0, local={**FULL_BATCH, "steps": 50, "lr": 0.05}))
    fed = federation(algorithm, data)
    early = run(fed, start(algorithm, data), 10)
    late = run(fed, early, 30, first=11)
    target = optimum(data, uniform=True)
    assert torch.linalg.norm(late.z["w"] - target) < 0.2 * torch.linalg.norm(early.z["w"] - target)


def local_path_by_hand(a, b, x, linear, steps, lr, momentum, mu=0.0):
    """Full-batch heavy-ball SGD (PyTorch semantics: buf <- momentum buf + d; w <- w - lr buf) on
    (1/2n)||A w - b||^2 + <w, linear> + (mu/2)||w - x||^2 from x: (the end point, the mean raw
    least-squares gradient along the path)."""
    w, buf, raw = x.clone(), None, []
    for _ in range(steps):
        g = a.T @ (a @ w - b) / len(b)
        raw.append(g)
        d = g + linear + mu * (w - x)
        buf = d if buf is None else momentum * buf + d
        w = w - lr * buf
    return w, sum(raw) / steps


def test_scaffold_option_two_with_momentum_keeps_the_mean_raw_gradient_exactly():
    """The docstring's choice: with momentum, c_i+ is the mean raw gradient taken along the path,
    not the paper's c_i - c + (x - y)/(K lr) (which overshoots ~1/(1 - beta)-fold and made setting A
    diverge). Two rounds, two clients, by hand: the second has a non-zero correction c - c_i."""
    data = least_squares_data(num_clients=2)
    steps, lr, beta = 4, 0.02, 0.9
    scaffold = Scaffold(ScaffoldConfig(fraction=1.0, local={**FULL_BATCH, "steps": steps, "momentum": beta}))
    fed = federation(scaffold, data)
    p = [data.client_size(c) / data.num_samples for c in range(2)]
    batches = [data.batch(data.client_indices(c)) for c in range(2)]
    x, c, c_i = torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64), [0.0, 0.0]
    state = start(scaffold, data)
    for round in (1, 2):
        paths = [local_path_by_hand(*batches[i], x, c - c_i[i], steps, lr, beta) for i in range(2)]
        paper = [c_i[i] - c + (x - y) / (steps * lr) for i, (y, _) in enumerate(paths)]
        x = x + sum(p[i] * (paths[i][0] - x) for i in range(2))
        c = c + sum(p[i] * (paths[i][1] - c_i[i]) for i in range(2))
        c_i = [g for _, g in paths]
        state, _ = fed.run_round(state, round)
        for i in range(2):
            held = fed.executor.pipeline.store.get(i)["c/w"]
            torch.testing.assert_close(held, c_i[i], rtol=1e-12, atol=1e-12)
            assert torch.linalg.norm(held - paper[i]) > 0.5 * torch.linalg.norm(held)  # the premise
        torch.testing.assert_close(state.params["w"], x, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(state.control["w"], c, rtol=1e-12, atol=1e-12)


def test_fedprox_trains_on_the_proximal_objective_by_hand():
    """mu > 0: every local step adds mu (w - w^t); two rounds, two clients, momentum 0.5."""
    data = least_squares_data(num_clients=2)
    steps, lr, mu = 5, 0.02, 0.7
    fedprox = FedProx(
        FedProxConfig(fraction=1.0, mu=mu, local={**FULL_BATCH, "steps": steps, "momentum": 0.5})
    )
    fed = federation(fedprox, data)
    n = [data.client_size(c) for c in range(2)]
    batches = [data.batch(data.client_indices(c)) for c in range(2)]
    x, state = torch.zeros(3, dtype=torch.float64), start(fedprox, data)
    for round in (1, 2):
        ends = [local_path_by_hand(*batches[i], x, 0.0, steps, lr, 0.5, mu)[0] for i in range(2)]
        without = [local_path_by_hand(*batches[i], x, 0.0, steps, lr, 0.5)[0] for i in range(2)]
        assert all(torch.linalg.norm(e - w) > 1e-3 for e, w in zip(ends, without, strict=True))  # mu bites
        x = x + sum(n[i] * (ends[i] - x) for i in range(2)) / sum(n)
        state, _ = fed.run_round(state, round)
        torch.testing.assert_close(state.params["w"], x, rtol=1e-12, atol=1e-12)


def test_scaffold_server_step_by_hand_and_partial_sums_combine_to_the_whole():
    """Two arrivals of 2 and 3 samples among 4 clients holding 10: p_i = n_i / 10, or 1/4 uniform."""

    def uplink(dy, dc, n):
        arrays = {"dy/w": np.array(dy, np.float64), "dc/w": np.array([dc, dc], np.float64)}
        return Message(arrays, {"num_samples": n})

    arrivals = [Arrival(1, uplink([1.0, 2.0], 0.5, 2)), Arrival(3, uplink([4.0, -1.0], -1.0, 3))]
    for weighting, server_lr, x, c in (
        ("samples", 1.0, [2.8, 0.2], 0.8),  # dy: (0.2 [1, 2] + 0.3 [4, -1]) / 0.5; c: 1 + 0.2 * 0.5 - 0.3
        ("samples", 0.5, [1.4, 0.1], 0.8),  # eta_g scales the model step, not c
        ("uniform", 1.0, [2.5, 0.5], 0.875),  # dy: 0.25 [5, 1] / 0.5; c: 1 + 0.25 (0.5 - 1)
    ):
        scaffold = Scaffold(ScaffoldConfig(weighting=weighting, server_lr=server_lr))
        scaffold.use_population(4, 10)
        start_state = scaffold.init_server({"w": torch.zeros(2, dtype=torch.float64)}, 4)
        start_state.control = {"w": torch.tensor([1.0, 1.0], dtype=torch.float64)}
        start_state.params = {"w": torch.zeros(2, dtype=torch.float64)}
        state = scaffold.aggregate(start_state, 1, scaffold.accumulate(arrivals))
        torch.testing.assert_close(state.params["w"], torch.tensor(x, dtype=torch.float64))
        torch.testing.assert_close(state.control["w"], torch.tensor([c, c], dtype=torch.float64))
        empty = scaffold.accumulate([])
        halves = scaffold.combine(
            [scaffold.accumulate(arrivals[:1]), empty, scaffold.accumulate(arrivals[1:])]
        )
        combined = scaffold.aggregate(start_state, 1, halves)
        torch.testing.assert_close(combined.params["w"], state.params["w"], rtol=0, atol=1e-15)
        torch.testing.assert_close(combined.control["w"], state.control["w"], rtol=0, atol=1e-15)
        assert scaffold.aggregate(start_state, 1, empty) is start_state


def test_fedadmm_samples_its_fraction_and_starts_each_round_with_fresh_momentum():
    fedadmm = FedADMM(FedADMMConfig(fraction=0.4, rho=0.5, local={"momentum": 0.9}))
    assert fedadmm.config.clients_per_round(5) == 2  # C N of the N agents, not every agent
    picked = fedadmm.select_clients(None, 1, 5, np.random.default_rng(0))
    assert len(picked) == 2 and len(set(picked.tolist())) == 2
    config = fedadmm.config
    assert (config.rho, config.per_agent_rho, config.persistent_momentum) == (0.5, False, False)
    assert config.delta == config.delta_z == 0.0 and config.local.momentum == 0.9


def test_scaffold_client_sends_dy_and_dc_with_its_count_and_a_finite_loss_only():
    """Option II, by hand: x = (1, 2), c = (0.5, 0), c_i = (0.25, 1): the correction c - c_i is
    (0.25, -1); a mean objective gradient (1, 1) gives c_i+ = (0.75, 2), so dc = (0.5, 1)."""
    from taciturn.algorithms.base import ClientContext, TrainResult
    from taciturn.core import Streams

    scaffold = Scaffold(ScaffoldConfig())
    received = Message({"x/w": np.array([1.0, 2.0]), "c/w": np.array([0.5, 0.0])})
    held = {"c/w": torch.tensor([0.25, 1.0], dtype=torch.float64)}
    ctx = ClientContext(3, 2, received, held, 6, Streams(0), None, None)
    work = scaffold.client_begin(ctx)
    assert sorted(work.consts) == ["c_i", "correction"] and work.track_gradient
    assert work.consts["correction"]["w"].tolist() == [0.25, -1.0]
    trained = {"w": torch.tensor([0.5, 3.0], dtype=torch.float64)}
    gradient = {"w": torch.tensor([1.0, 1.0], dtype=torch.float64)}
    out = scaffold.client_end(ctx, work, TrainResult(trained, None, 4, 0.75, mean_gradient=gradient))
    assert out.uplink.arrays["dy/w"].tolist() == [-0.5, 1.0] and out.uplink.arrays["dc/w"].tolist() == [
        0.5,
        1.0,
    ]
    assert dict(out.uplink.meta) == {"num_samples": 6, "train_loss": 0.75}
    assert out.state["c/w"].tolist() == [0.75, 2.0]
    nan = scaffold.client_end(ctx, work, TrainResult(trained, None, 4, float("nan"), mean_gradient=gradient))
    assert dict(nan.uplink.meta) == {"num_samples": 6}
