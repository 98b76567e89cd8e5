"""Models with buffers under every algorithm that federates them (issue 44): FedProx, SCAFFOLD,
FedADMM and event-based ADMM apply their math to the weights; BatchNorm statistics are averaged, or
kept by each client (FedBN). Each is checked against two rounds computed by hand with torch modules
and torch.optim.SGD: two clients (one class each, 120 and 80 samples), two full-batch steps each."""

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import taciturn
from taciturn.core.state_store import MemoryStateStore
from tests.test_buffers import bn_mlp, two_classes

LR, STEPS = 0.1, 2
SIZES = (120.0, 80.0)  # client k holds class k


def gn_mlp(seed=0):
    """GroupNorm keeps no running statistics: nothing but weights to federate."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 4), nn.GroupNorm(2, 4), nn.ReLU(), nn.Linear(4, 2))


def floating(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in model.state_dict().items() if t.is_floating_point()}


def buffer_names(model: nn.Module) -> set[str]:
    return {n for n, b in model.named_buffers() if b.is_floating_point()}


def local_sgd(start, state, x, y, extra=None):
    """STEPS steps of torch.optim.SGD on cross-entropy (+ ``extra(named weights)``) from ``state``;
    the trained state (weights and running statistics) and the mean raw loss gradient."""
    model = copy.deepcopy(start)
    model.load_state_dict(state, strict=False)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    raw = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        names, weights = zip(*model.named_parameters(), strict=True)
        for n, g in zip(names, torch.autograd.grad(loss, weights, retain_graph=True), strict=True):
            raw[n] += g / STEPS
        (loss + (extra(dict(model.named_parameters())) if extra else 0)).backward()
        optimizer.step()
    return floating(model), raw


def mean(states, weights):
    total = sum(weights)
    return {n: sum(w * s[n] for w, s in zip(weights, states, strict=True)) / total for n in states[0]}


def run(tmp_path, algorithm, model, buffers="federated", rounds=2):
    x, y = two_classes()
    config = {
        "rounds": rounds,
        "partition": {"kind": "one_class", "num_clients": 2},
        "algorithm": {"fraction": 1.0, "local": {"steps": STEPS, "batch_size": 1000, "lr": LR}, **algorithm},
        "engine": {"executor": "sequential"},
        "checkpoint": {"every": rounds},
    }
    if buffers == "local":
        config["model"] = {"buffers": buffers}
    result = taciturn.run(
        config, model=copy.deepcopy(model), data=(x, y, x[:10], y[:10]), out=tmp_path / "r", report=False
    )
    (folder,) = (p.parent for p in Path(result.dir).rglob("server.safetensors"))
    store = MemoryStateStore()
    store.load(folder)
    return result, store, [(x[y == k], y[y == k]) for k in (0, 1)]


def assert_close(model: nn.Module, expected: dict[str, torch.Tensor]):
    got = floating(model)
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.allclose(got[name], tensor, atol=1e-5), name


def own_start(global_state, own, local, names):
    """Where a client starts: the global state, with its own statistics under FedBN (once it has some)."""
    if local and own is not None:
        return global_state | {n: own[n] for n in names}
    return global_state


@pytest.mark.parametrize("buffers", ["federated", "local"])
def test_fedprox_proximal_term_on_the_weights_statistics_averaged_or_kept(tmp_path, buffers):
    """h_k(w) = F_k(w) + (mu / 2) ||w - w^t||^2 over the weights (Li et al., MLSys 2020, Eq. 2); the
    statistics are averaged n_k-weighted (or stay with each client)."""
    mu, start = 0.5, bn_mlp()
    result, store, data = run(tmp_path, {"name": "fedprox", "mu": mu}, start, buffers)
    names, local = buffer_names(start), buffers == "local"
    server, own = floating(start), [None, None]
    for _ in range(2):
        anchor = {n: t.clone() for n, t in server.items() if n not in names}
        trained = []
        for k, (x, y) in enumerate(data):

            def prox(w, anchor=anchor):
                return 0.5 * mu * sum(((w[n] - anchor[n]) ** 2).sum() for n in anchor)

            state, _ = local_sgd(start, own_start(server, own[k], local, names), x, y, prox)
            trained.append(state)
            own[k] = state
        averaged = mean(trained, SIZES)
        server = averaged | ({n: server[n] for n in names} if local else {})
    assert_close(result.model, server)
    assert sorted(store.clients()) == ([0, 1] if local else [])
    for k in store.clients():
        for n in names:
            assert torch.allclose(store.get(k)[f"buffers/{n}"], own[k][n], atol=1e-6)


@pytest.mark.parametrize(
    ("make", "buffers"), [(bn_mlp, "federated"), (bn_mlp, "local"), (gn_mlp, "federated")]
)
def test_scaffold_control_variates_cover_the_weights_statistics_averaged_or_kept(tmp_path, make, buffers):
    """SCAFFOLD (Karimireddy et al., ICML 2020, Alg. 1, option II, p_i = n_i / n): corrected steps
    y <- y - lr (g_i(y) - c_i + c), c_i+ = the mean raw gradient, x <- x + mean(dy), c <- c + sum p_i dc_i,
    with c and c_i over the weights only; statistics averaged with p_i (or kept). A GroupNorm model
    has no statistics at all."""
    start = make()
    result, store, data = run(tmp_path, {"name": "scaffold"}, start, buffers)
    names, local = buffer_names(start), buffers == "local"
    server, own = floating(start), [None, None]
    weights_of = [n for n, _ in start.named_parameters()]
    c = {n: torch.zeros_like(server[n]) for n in weights_of}
    c_i = [dict(c), dict(c)]
    for _ in range(2):
        trained, new_c = [], []
        for k, (x, y) in enumerate(data):
            correction = {n: c[n] - c_i[k][n] for n in weights_of}

            def linear(w, correction=correction):
                return sum((w[n] * correction[n]).sum() for n in correction)

            state, raw = local_sgd(start, own_start(server, own[k], local, names), x, y, linear)
            trained.append(state)
            new_c.append(raw)
            own[k] = state
        p = [s / sum(SIZES) for s in SIZES]
        averaged = mean(trained, SIZES)
        server = averaged | ({n: server[n] for n in names} if local else {})
        c = {n: c[n] + sum(p[k] * (new_c[k][n] - c_i[k][n]) for k in (0, 1)) for n in weights_of}
        c_i = new_c
    assert_close(result.model, server)
    for k in (0, 1):
        state = store.get(k)
        assert sorted(state) == sorted(
            [f"c/{n}" for n in weights_of] + [f"buffers/{n}" for n in names if local]
        )
        for n in weights_of:
            assert torch.allclose(state[f"c/{n}"], c_i[k][n], atol=1e-4), n  # float32 through GroupNorm
        for n in names if local else ():
            assert torch.allclose(state[f"buffers/{n}"], own[k][n], atol=1e-6), n


@pytest.mark.parametrize(
    ("algorithm", "rho_i", "alpha"),
    [
        ({"name": "fedadmm", "rho": 0.5}, (0.5, 0.5), 1.0),
        # rho_i = rho / (N p_i): mean size 100 over 120 and 80 samples; over-relaxation on the weights
        ({"name": "event_admm", "rho": 0.5, "relaxation": 1.5}, (0.5 * 100 / 120, 0.5 * 100 / 80), 1.5),
    ],
)
@pytest.mark.parametrize("buffers", ["federated", "local"])
def test_admm_duals_and_relaxation_cover_the_weights_statistics_averaged_or_kept(
    tmp_path, algorithm, rho_i, alpha, buffers
):
    """Scaled-form ADMM (FedADMM; Er, Trimpe, Muehlebach, ICML 2025, Alg. 1 with Delta = 0):
    x_i = argmin f_i(x) + (rho_i / 2) ||x - z + u_i||^2 (two SGD steps from z), x_hat_i = alpha x_i +
    (1 - alpha) z, u_i <- u_i + x_hat_i - z, z = mean_i (x_hat_i + u_i), all on the weights; z's
    statistics are the mean of the agents' trained ones (or stay the initial ones under FedBN)."""
    start = bn_mlp()
    result, store, data = run(tmp_path, algorithm, start, buffers)
    names, local = buffer_names(start), buffers == "local"
    z, own = floating(start), [None, None]
    weights_of = [n for n, _ in start.named_parameters()]
    u = [None, None]
    x_hat = [None, None]
    for _ in range(2):
        sent = []
        for k, (x, y) in enumerate(data):
            if u[k] is None:
                u[k] = {n: torch.zeros_like(z[n]) for n in weights_of}
            else:  # u_i <- u_i + x_hat_i - z (with the z the agent just received)
                u[k] = {n: u[k][n] + x_hat[k][n] - z[n] for n in weights_of}
            anchor = {n: z[n] - u[k][n] for n in weights_of}

            def penalty(w, anchor=anchor, rho=rho_i[k]):
                return 0.5 * rho * sum(((w[n] - anchor[n]) ** 2).sum() for n in anchor)

            state, _ = local_sgd(start, own_start(z, own[k], local, names), x, y, penalty)
            own[k] = state
            x_hat[k] = {n: alpha * state[n] + (1 - alpha) * z[n] for n in weights_of}
            sent.append({n: x_hat[k][n] + u[k][n] for n in weights_of} | {n: state[n] for n in names})
        z = mean(sent, (1.0, 1.0)) | ({n: z[n] for n in names} if local else {})
    assert_close(result.model, z)
    for k in (0, 1):
        state = store.get(k)
        for n in weights_of:
            assert torch.allclose(state[f"u/{n}"], u[k][n], atol=1e-5), n
        assert any(key.startswith("buffers/") for key in state) == local
        assert not any(
            key.startswith(("u/", "x_hat/", "last/")) and key.split("/", 1)[1] in names for key in state
        )
        for n in names if local else ():
            assert torch.allclose(state[f"buffers/{n}"], own[k][n], atol=1e-6), n
