"""Local optimizers, schedules, mixed precision and kept optimizer state (issue 44), against torch's
own optimizers, schedulers and GradScaler stepped by hand."""

import copy
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import taciturn
from taciturn.algorithms.base import LocalConfig
from taciturn.algorithms.schedule import Schedule
from taciturn.core.state_store import MemoryStateStore
from taciturn.experiments.config import ConfigError

STEPS = 4


def blobs(n=64):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 6, generator=g)
    return x, (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()


def net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def one_client(tmp_path, local, rounds=1, **extra):
    """FedAvg with a single client holding all the data, full-batch steps: the global model is that
    client's model, so it must equal torch's optimizer stepped on the whole set."""
    x, y = blobs()
    config = {
        "rounds": rounds,
        "partition": {"kind": "iid", "num_clients": 1},
        "algorithm": {"fraction": 1.0, "local": {"steps": STEPS, "batch_size": 1000, **local}, **extra},
        "engine": {"executor": "sequential"},
        "checkpoint": {"every": rounds},
    }
    start = net()
    result = taciturn.run(
        config, model=copy.deepcopy(start), data=(x, y, x[:8], y[:8]), out=tmp_path / "r", report=False
    )
    return result, start, x, y


def by_hand(start, x, y, optimizer, steps=STEPS, scheduler=None, autocast=None, scaler=None):
    model = copy.deepcopy(start)
    opt = optimizer(model.parameters())
    sched = scheduler(opt) if scheduler else None
    for _ in range(steps):
        opt.zero_grad()
        if autocast:
            with torch.autocast("cpu", dtype=autocast):
                loss = F.cross_entropy(model(x), y)
        else:
            loss = F.cross_entropy(model(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        if sched:
            sched.step()
    return model


def assert_same(a: nn.Module, b: nn.Module, **tolerance):
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(p, q, msg=name, **(tolerance or {"rtol": 0, "atol": 1e-7}))


OPTIMIZERS = [
    ({"lr": 0.1}, lambda p: torch.optim.SGD(p, lr=0.1)),
    (
        {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    ),
    (
        {"optimizer": "adam", "lr": 0.01, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.01},
        lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01),
    ),
    ({"optimizer": "adamw", "lr": 0.01}, lambda p: torch.optim.AdamW(p, lr=0.01)),  # decay 0.01 as torch
]


@pytest.mark.parametrize(("local", "optimizer"), OPTIMIZERS, ids=["sgd", "nesterov", "adam", "adamw"])
def test_local_steps_are_torch_optimizers_stepped_by_hand(tmp_path, local, optimizer):
    result, start, x, y = one_client(tmp_path, local)
    assert_same(result.model, by_hand(start, x, y, optimizer))
    if local.get("optimizer") == "adamw":
        assert "weight_decay = 0.01" in (Path(result.dir) / "config.toml").read_text()  # resolved


def test_a_schedule_over_local_steps_is_torchs_scheduler_stepped_by_hand(tmp_path):
    """warmup 1 then cosine to 0.1 over the other 3 steps: SequentialLR(LinearLR, CosineAnnealingLR)."""
    local = {"optimizer": "adam", "lr": 0.02, "schedule": {"kind": "cosine", "warmup": 1, "final": 0.1}}
    result, start, x, y = one_client(tmp_path, local)

    def scheduler(opt):
        warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1 / 2, end_factor=1.0, total_iters=1)
        cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS - 1, eta_min=0.1 * 0.02)
        return torch.optim.lr_scheduler.SequentialLR(opt, [warm, cosine], milestones=[1])

    expected = by_hand(start, x, y, lambda p: torch.optim.Adam(p, lr=0.02), scheduler=scheduler)
    assert_same(result.model, expected, rtol=1e-6, atol=1e-7)  # torch's recursive cosine vs the closed form


@pytest.mark.parametrize(
    ("schedule", "torch_scheduler"),
    [
        ({"kind": "cosine", "final": 0.2}, lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 10, 0.2)),
        ({"kind": "linear", "final": 0.3}, lambda o: torch.optim.lr_scheduler.LinearLR(o, 1.0, 0.3, 10)),
        (
            {"kind": "step", "gamma": 0.5, "step_size": 3},
            lambda o: torch.optim.lr_scheduler.StepLR(o, 3, 0.5),
        ),
        ({"kind": "exponential", "gamma": 0.9}, lambda o: torch.optim.lr_scheduler.ExponentialLR(o, 0.9)),
        (
            {"kind": "linear", "warmup": 3},
            lambda o: torch.optim.lr_scheduler.SequentialLR(
                o,
                [
                    torch.optim.lr_scheduler.LinearLR(o, 1 / 4, 1.0, 3),
                    torch.optim.lr_scheduler.LinearLR(o, 1.0, 0.0, 7),
                ],
                [3],
            ),
        ),
    ],
)
def test_schedule_factors_are_torchs_schedulers(schedule, torch_scheduler):
    """Every factor over T = 10 steps (t = 0..10) equals the learning rate torch's scheduler sets (base 1)."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched, ours = torch_scheduler(opt), Schedule(**schedule)
    for t in range(11):
        assert ours.factor(t, 10) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-9, abs=1e-12), t
        opt.step()
        sched.step()


def test_round_and_server_schedules_follow_the_rounds(tmp_path):
    """Three rounds of one client, one full-batch SGD step each: the client's lr at round r is
    0.5 * cosine(r - 1 of 3) and the server moves by server_lr * 0.5^(r - 1) times the delta."""
    x, y = blobs()
    local = {"lr": 0.5, "steps": 1, "round_schedule": {"kind": "cosine"}}
    result, start, x, y = one_client(
        tmp_path, local, rounds=3, server_lr=2.0, server_schedule={"kind": "exponential", "gamma": 0.5}
    )
    model = copy.deepcopy(start)
    for r in range(3):
        lr = 0.5 * (1 + math.cos(math.pi * r / 3)) / 2
        client = copy.deepcopy(model)
        torch.optim.SGD(client.parameters(), lr=lr).zero_grad()
        F.cross_entropy(client(x), y).backward()
        with torch.no_grad():
            for p, q in zip(model.parameters(), client.parameters(), strict=True):
                p -= 2.0 * 0.5**r * lr * q.grad
    assert_same(result.model, model, rtol=1e-6, atol=1e-7)
    text = (Path(result.dir) / "config.toml").read_text()
    assert text.count("steps = 3") == 2  # both schedules span the run's 3 rounds in the resolved config


@pytest.mark.parametrize("kept", ["keep", "reset"])
def test_adam_state_is_kept_across_rounds_or_reset(tmp_path, kept):
    """One client, two rounds of two Adam steps: kept, its moments and step count carry over, so the
    model is four consecutive Adam steps; reset, two fresh optimizers of two steps each."""
    local = {"optimizer": "adam", "lr": 0.05, "steps": 2, "optimizer_state": kept}
    result, start, x, y = one_client(tmp_path, local, rounds=2)
    adam = lambda p: torch.optim.Adam(p, lr=0.05)  # noqa: E731
    expected = (
        by_hand(start, x, y, adam, steps=4)
        if kept == "keep"
        else by_hand(by_hand(start, x, y, adam, steps=2), x, y, adam, steps=2)
    )
    assert_same(result.model, expected, rtol=1e-6, atol=1e-7)
    store = MemoryStateStore()
    store.load(max(p.parent for p in Path(result.dir).rglob("server.safetensors")))
    if kept == "keep":
        state = store.get(0)
        assert float(state["optimizer/step"]) == 4.0 and "optimizer/exp_avg/0.weight" in state
    else:
        assert list(store.clients()) == []


def test_a_kept_optimizer_state_takes_effect_only_when_the_server_accepts_the_update(tmp_path):
    """Acceptance (DESIGN.md): every uplink lost, so no client's optimizer state is ever stored."""
    x, y = blobs()
    config = {
        "rounds": 2,
        "partition": {"kind": "iid", "num_clients": 2},
        "algorithm": {"fraction": 1.0, "local": {"optimizer": "adam", "optimizer_state": "keep", "steps": 2}},
        "channel": {"drop_up": 1.0},
        "engine": {"executor": "sequential"},
        "checkpoint": {"every": 2},
    }
    result = taciturn.run(config, model=net(), data=(x, y, x, y), out=tmp_path / "lost", report=False)
    store = MemoryStateStore()
    store.load(max(p.parent for p in Path(result.dir).rglob("server.safetensors")))
    assert list(store.clients()) == []
    config["channel"] = {"drop_up": 0.0}
    result = taciturn.run(config, model=net(), data=(x, y, x, y), out=tmp_path / "kept", report=False)
    store.load(max(p.parent for p in Path(result.dir).rglob("server.safetensors")))
    assert sorted(store.clients()) == [0, 1]


def test_resume_with_kept_adam_state_ends_with_the_numbers_of_an_uninterrupted_run(tmp_path):
    from taciturn.experiments.runner import resume, start
    from tests.conftest import tiny_config
    from tests.test_runner import Interrupt, metrics_without_time, stop_after

    local = {"optimizer": "adam", "lr": 0.05, "optimizer_state": "keep", "epochs": 1, "batch_size": 16}
    config = tiny_config(rounds=5, algorithm={"name": "fedavg", "fraction": 0.5, "local": local})
    whole = start(config, tmp_path / "whole", progress=False)
    with pytest.raises(Interrupt):
        start(config, tmp_path / "cut", progress=False, callbacks=(stop_after(3),))
    resumed = resume(tmp_path / "cut", progress=False)
    assert metrics_without_time(resumed) == metrics_without_time(whole)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_is_torch_autocast_stepped_by_hand(tmp_path, precision):
    """bf16: the forward pass under torch.autocast; fp16 also scales the loss with torch.amp.GradScaler
    (the documented recipe: scale, backward, scaler.step, scaler.update). Weights stay float32."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    result, start, x, y = one_client(tmp_path, {"lr": 0.1, "momentum": 0.5, "precision": precision})
    scaler = torch.amp.GradScaler("cpu") if precision == "fp16" else None
    sgd = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.5)  # noqa: E731
    expected = by_hand(start, x, y, sgd, autocast=dtype, scaler=scaler)
    assert_same(result.model, expected, rtol=1e-6, atol=1e-6)
    full = by_hand(start, x, y, sgd)
    assert all(p.dtype == torch.float32 for p in result.model.parameters())
    assert not torch.allclose(result.model[0].weight, full[0].weight, rtol=0, atol=1e-6)  # it did change


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"algorithm": {"local": {"betas": [0.9, 0.9]}}},
            r"betas applies only with optimizer = 'adam' or 'adamw'",
        ),
        (
            {"algorithm": {"local": {"optimizer": "adam", "momentum": 0.9}}},
            r"momentum applies only with optimizer = 'sgd'",
        ),
        ({"algorithm": {"local": {"nesterov": True}}}, r"nesterov needs momentum > 0"),
        ({"algorithm": {"local": {"optimizer": "adamm"}}}, r"optimizer"),
        (
            {"algorithm": {"local": {"schedule": {"kind": "cosine", "gamma": 0.5}}}},
            r"gamma applies only with kind",
        ),
        (
            {"algorithm": {"local": {"precision": "fp16"}}, "engine": {"executor": "vectorized"}},
            r"'vectorized' steps every client at once, which fp16's loss scaling cannot",
        ),
        ({"algorithm": {"name": "fedkseed", "local": {"optimizer": "adam"}}}, r"FedKSeed takes plain"),
    ],
)
def test_optimizer_options_that_do_not_fit_are_refused_before_work(tmp_path, overrides, message):
    x, y = blobs()
    config = {"rounds": 1, "partition": {"kind": "iid", "num_clients": 2}} | overrides
    with pytest.raises(ConfigError, match=message):
        taciturn.run(config, model=net(), data=(x, y, x, y), out=tmp_path / "r", report=False)
    assert not (tmp_path / "r").exists()


def test_local_config_defaults_are_plain_sgd():
    config = LocalConfig()
    assert (config.optimizer, config.weight_decay, config.optimizer_state) == ("sgd", 0.0, "reset")
    assert config.plain_sgd_steps and not LocalConfig(schedule={"kind": "cosine"}).plain_sgd_steps
