"""Lazy-training metrics on hand-checkable cases: NTK, linearisation, divergence, kernel dynamics."""

import math

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, jacrev, jvp, vmap

from taciturn.tasks.lazy import divergence, linearization_rmse, linearized_fedavg, param_rmse, rmse
from taciturn.tasks.models import build_model
from taciturn.tasks.ntk import empirical_ntk, relative_change


def params_of(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def reference_ntk(model, params, x):
    """J J^T with the full Jacobian from torch.func, sample-major rows."""

    def f(p, sample):
        return functional_call(model, p, (sample.unsqueeze(0),)).reshape(-1)

    jac = vmap(jacrev(f), in_dims=(None, 0))(params, x)
    j = torch.cat([v.reshape(len(x) * v.shape[1], -1) for v in jac.values()], dim=1)
    return j @ j.T


@pytest.mark.parametrize(
    ("kind", "options", "shape"),
    [
        ("mlp", {"hidden": [12, 7]}, (1, 5, 5)),  # dense layers only: closed form throughout
        ("lenet", {"width": 1}, (1, 16, 16)),  # convolutions by Jacobian contraction, dense by closed form
    ],
)
@pytest.mark.parametrize("parameterization", ["pytorch", "ntk"])
@pytest.mark.parametrize("outputs", [1, 3])
def test_empirical_ntk_matches_the_full_jacobian(kind, options, shape, parameterization, outputs):
    torch.manual_seed(0)
    model = build_model(kind, shape, outputs, parameterization=parameterization, **options)
    params, x = params_of(model), torch.randn(6, *shape)
    theta = empirical_ntk(model, params, x)
    assert theta.shape == (6 * outputs, 6 * outputs)
    torch.testing.assert_close(theta, reference_ntk(model, params, x), rtol=1e-4, atol=1e-5)


def test_ntk_of_a_linear_model_by_hand():
    # f(x) = s_w w.x + s_b b with s_w^2 = 2/3, s_b^2 = 0.5: Theta(x, x') = (2/3) x.x' + 0.5
    model = build_model("logreg", (3,), 1, parameterization="ntk", weight_var=2.0, bias_var=0.5)
    x = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, -1.0]])
    expected = (2.0 / 3.0) * (x @ x.T) + 0.5
    torch.testing.assert_close(empirical_ntk(model, params_of(model), x), expected)


def test_relative_change():
    k = torch.eye(2)
    assert relative_change(k, k.clone()) == 0.0
    assert relative_change(k, 2 * k) == pytest.approx(1.0)


def test_a_linear_model_equals_its_linearisation():
    model = build_model("logreg", (4,), 3, parameterization="ntk")
    p0 = params_of(model)
    far = {k: v + 5 * torch.randn_like(v) for k, v in p0.items()}
    assert linearization_rmse(model, p0, far, torch.randn(9, 4)) < 1e-5


def test_linearisation_gap_of_a_two_layer_linear_network_is_its_second_order_term():
    # f = v^T W x is bilinear: f(theta) - f_lin(theta) = dv^T dW x exactly.
    model = nn.Sequential(nn.Linear(3, 4, bias=False), nn.Linear(4, 1, bias=False))
    p0 = params_of(model)
    dw, dv = torch.randn(4, 3), torch.randn(1, 4)
    moved = {"0.weight": p0["0.weight"] + dw, "1.weight": p0["1.weight"] + dv}
    x = torch.randn(5, 3)
    expected = float(((x @ dw.T) @ dv.T).pow(2).mean().sqrt())
    assert linearization_rmse(model, p0, moved, x, batch_size=2) == pytest.approx(expected, rel=1e-5)
    assert linearization_rmse(model, p0, p0, x) == 0.0


def test_divergence_by_hand_and_identical_models_give_zero():
    models = [{"w": torch.tensor([0.0])}, {"w": torch.tensor([2.0])}]
    # weights 1 and 3: mean 1.5; 1/4 * 1.5 + 3/4 * 0.5 = 0.75
    assert divergence(models, [1, 3]) == pytest.approx(0.75)
    shifted = [{"w": m["w"] + 10.0} for m in models]  # only differences matter
    assert divergence(shifted, [1, 3]) == pytest.approx(0.75)
    same = {"a": torch.randn(5, 3), "b": torch.randn(2)}
    assert divergence([same, same, same], [1, 2, 3]) == 0.0
    with pytest.raises(ValueError, match="one weight per model"):
        divergence([same], [1, 2])


def test_rmse_helpers():
    assert rmse(torch.zeros(4), torch.tensor([2.0, 0.0, 0.0, 0.0])) == pytest.approx(1.0)
    a, b = {"x": torch.zeros(2), "y": torch.zeros(2)}, {"x": torch.tensor([2.0, 0.0]), "y": torch.zeros(2)}
    assert param_rmse(a, b) == pytest.approx(1.0)


def test_linearized_fedavg_with_one_local_step_is_centralized_gradient_descent():
    torch.manual_seed(1)
    a = torch.randn(6, 6)
    theta = a @ a.T / 6  # a positive semi-definite kernel over 6 points, 1 output
    f0, targets = torch.randn(6, 1), torch.randn(6, 1)
    clients = [[0, 1], [2, 3, 4]]  # point 5 is a test point
    fedavg = linearized_fedavg(theta, f0, targets, clients, lr=0.3, local_steps=1, rounds=4)
    central = linearized_fedavg(theta, f0, targets, [[0, 1, 2, 3, 4]], lr=0.3, local_steps=1, rounds=4)
    torch.testing.assert_close(fedavg, central)
    # by hand, one round: f1 = f0 - (lr / N) Theta[:, train] (f0 - t)[train]
    train = torch.tensor([0, 1, 2, 3, 4])
    by_hand = f0[:, 0] - 0.3 / 5 * theta[:, train] @ (f0[train, 0] - targets[train, 0])
    torch.testing.assert_close(central[1, :, 0], by_hand)
    drift = linearized_fedavg(theta, f0, targets, clients, lr=0.3, local_steps=5, rounds=4)
    assert not torch.allclose(drift, linearized_fedavg(theta, f0, targets, [[0, 1, 2, 3, 4]], 0.3, 5, 4))
    assert math.isclose(float(drift[0].sub(f0).abs().max()), 0.0)


def test_linearized_fedavg_is_fedavg_on_the_taylor_model_of_a_nonlinear_network():
    """Thm 2's f_lin (Jian & Liu, ICML 2025), trained by FedAvg in parameter space: the first-order
    Taylor model f_lin(w) = f(w0) + J(w0)(w - w0) by torch.func.jvp, its squared-loss gradient by
    torch.func.grad through it, tau local steps per client, sample-weighted averaging. Its outputs on
    training and held-out points are linearized_fedavg's with the empirical NTK at w0, to float64
    precision; the network itself trained by the same FedAvg leaves it."""
    torch.manual_seed(2)
    model = build_model("mlp", (5,), 2, parameterization="ntk", hidden=[16, 16]).double()
    w0 = params_of(model)
    x, targets = torch.randn(7, 5, dtype=torch.float64), torch.randn(7, 2, dtype=torch.float64)
    clients, lr, steps, rounds = [[0, 1], [2, 3, 4], [5]], 0.2, 3, 4  # point 6 is held out

    def f(w, points=slice(None)):
        return functional_call(model, w, (x[points],))

    def f_lin(w, points=slice(None)):
        base, tangent = jvp(lambda p: f(p, points), (w0,), ({k: w[k] - w0[k] for k in w0},))
        return base + tangent

    def fedavg(outputs_of):
        w, trajectory = dict(w0), [outputs_of(w0)]
        for _ in range(rounds):
            averaged = {k: torch.zeros_like(v) for k, v in w.items()}
            for points in clients:

                def loss(p, points=points):
                    return 0.5 * (outputs_of(p, points) - targets[points]).pow(2).sum() / len(points)

                local = dict(w)
                for _ in range(steps):
                    gradient = grad(loss)(local)
                    local = {k: v - lr * gradient[k] for k, v in local.items()}
                for k in averaged:
                    averaged[k] += len(points) / 6 * local[k]
            w = averaged
            trajectory.append(outputs_of(w))
        return torch.stack(trajectory)

    linear = fedavg(f_lin)
    kernel = linearized_fedavg(
        empirical_ntk(model, w0, x), f(w0).detach(), targets, clients, lr, steps, rounds
    )
    torch.testing.assert_close(kernel, linear.detach(), rtol=1e-10, atol=1e-12)
    assert rmse(fedavg(f)[-1], linear[-1]) > 1e-3  # Thm 2's quantity is not zero at width 16
