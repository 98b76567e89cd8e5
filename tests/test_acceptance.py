"""Client state under lost and rejected messages (DESIGN.md, "Acceptance").

A client's new state takes effect only when the server accepted the uplink that carries its
consequence. So the invariants that tie client and server state together hold exactly whatever the
channel loses or the server rejects, and a method that reaches the optimum of heterogeneous least
squares without loss reaches it with loss too (more slowly).
"""

import numpy as np
import pytest
import torch

from taciturn.algorithms.base import ClientOutput
from taciturn.algorithms.event_admm import EventADMM, EventADMMConfig
from taciturn.algorithms.fedadmm import FedADMM, FedADMMConfig
from taciturn.algorithms.fedkseed import FedKSeed, FedKSeedConfig
from taciturn.algorithms.ferret import Ferret, FerretConfig
from taciturn.algorithms.scaffold import Scaffold, ScaffoldConfig
from taciturn.core import Direction, Message
from taciturn.core.params import clone
from tests.quadratic import ExactXUpdate, federation, least_squares_data, optimum, start

LOCAL = {"steps": 5, "batch_size": 10_000, "lr": 0.03}  # full-batch local steps
DROP = 0.2  # each message, up and down, is lost with this probability


def poisoned(client: int, round: int) -> bool:
    return (client + round) % 3 == 0


class Poisoning:
    """Mixin: in the client-rounds ``poisoned`` picks, the client's training "blew up": its uplink
    and its new state are NaN. The server must reject the uplink and the NaN state must never be
    stored (stored, it would poison every later round of that client)."""

    poison = False

    def client_end(self, ctx, work, result):
        return self._poisoned(ctx, super().client_end(ctx, work, result))

    def _poisoned(self, ctx, out: ClientOutput) -> ClientOutput:
        if not (self.poison and poisoned(ctx.client, ctx.round)) or out.uplink is None:
            return out
        arrays = {
            k: np.full_like(v, np.nan) if v.dtype.kind == "f" else v for k, v in out.uplink.arrays.items()
        }
        state = {
            k: torch.full_like(v, torch.nan) if v.is_floating_point() else v for k, v in out.state.items()
        }
        return ClientOutput(Message(arrays, dict(out.uplink.meta)), state, out.info)


class LossyScaffold(Poisoning, Scaffold):
    pass


class LossyADMM(Poisoning, ExactXUpdate, EventADMM):
    def finish(self, ctx, z_hat, u, x, meta):  # ExactXUpdate ends here, not in client_end
        return self._poisoned(ctx, super().finish(ctx, z_hat, u, x, meta))


class LossyFedADMM(LossyADMM, FedADMM):
    pass


def lossy_run(algorithm, data, rounds, check):
    """``rounds`` rounds under uplink drops, downlink drops and rejected (poisoned) updates, with
    ``check(fed, state, round)`` after every round."""
    algorithm.poison = True
    fed = federation(algorithm, data, seed=1, drop_up=DROP, drop_down=DROP)
    state, rejected = start(algorithm, data), 0
    for r in range(1, rounds + 1):
        state, report = fed.run_round(state, r)
        rejected += len(report.rejected)
        check(fed, state, r)
    ledger = fed.executor.pipeline.channel.ledger
    lost = [ledger.totals(d).messages_sent - ledger.totals(d).messages_delivered for d in Direction]
    assert min(lost) > 0 and rejected > 0  # the premise: every kind of loss happened
    return fed, state


def scaffold_invariant(data, weights):
    def check(fed, state, round):
        store = fed.executor.pipeline.store
        held = [store.get(c) for c in range(data.num_clients)]
        mean_ci = sum(w * h["c/w"] for w, h in zip(weights, held, strict=True) if h is not None)
        torch.testing.assert_close(state.control["w"], mean_ci, rtol=0, atol=1e-12, msg=f"round {round}")

    return check


@pytest.mark.parametrize("option", ["I", "II"])
def test_scaffold_keeps_c_the_weighted_sum_of_client_variates_and_reaches_the_optimum(option):
    """Committing c_i before delivery left x 3.5 (option I) and 0.93 (option II) from x* here."""
    data = least_squares_data()
    scaffold = LossyScaffold(ScaffoldConfig(fraction=1.0, option=option, local=LOCAL))
    weights = [data.client_size(c) / data.num_samples for c in range(data.num_clients)]
    _, state = lossy_run(scaffold, data, 80, scaffold_invariant(data, weights))
    torch.testing.assert_close(state.params["w"], optimum(data), rtol=0, atol=1e-6)


def admm_invariant(data):
    """With Delta = 0 every agent that computed sent v_i = x_hat_i + u_i, so the server's copy s_i is
    exactly the agent's committed x_hat_i + u_i (and its ``last``)."""

    def check(fed, state, round):
        store = fed.executor.pipeline.store
        for c in range(data.num_clients):
            held = store.get(c)
            copy = state.copies["w"][c]
            if held is None:  # never heard from: the server still holds z^0
                assert torch.equal(copy, torch.zeros_like(copy)), f"round {round}, agent {c}"
                continue
            assert torch.isfinite(held["u/w"]).all()
            assert torch.equal(copy, held["last/w"]), f"round {round}, agent {c}"
            torch.testing.assert_close(copy, held["x_hat/w"] + held["u/w"], rtol=0, atol=1e-12)

    return check


@pytest.mark.parametrize(("kind", "rounds"), [("event_admm", 120), ("fedadmm", 160)])
def test_admm_copies_match_the_agents_and_reach_the_consensus_optimum(kind, rounds):
    """Committing the dual before delivery left z 0.79 (event ADMM) and 0.38 (FedADMM) from x* here."""
    data = least_squares_data()
    if kind == "event_admm":
        algorithm = LossyADMM(EventADMMConfig(rho=5.0))
    else:
        algorithm = LossyFedADMM(FedADMMConfig(rho=5.0, fraction=0.6))
    _, state = lossy_run(algorithm, data, rounds, admm_invariant(data))
    # rho_i = rho / (N p_i) targets sum_i p_i f_i; one rho for all (FedADMM) targets the uniform mean.
    target = optimum(data, uniform=kind == "fedadmm")
    torch.testing.assert_close(state.z["w"], target, rtol=0, atol=1e-6)


def replay_invariant(data, models):
    """The round each client holds is the round the server believes it holds, and its copy is the
    server's model of that round bit for bit (Ferret, FedKSeed)."""

    def check(fed, state, round):
        models[round] = clone(state.params)
        store = fed.executor.pipeline.store
        for c in range(data.num_clients):
            held = store.get(c)
            synced = int(state.synced[c])
            if held is None:
                assert synced == 0
                continue
            assert int(held["synced_round"]) == synced, f"round {round}, client {c}"
            assert torch.equal(held["params/w"], models[synced]["w"]), f"round {round}, client {c}"

    return check


class LossyFerret(Poisoning, Ferret):
    pass


class LossyFedKSeed(Poisoning, FedKSeed):
    def client_begin(self, ctx):  # FedKSeed finishes in client_begin (zeroth-order steps)
        return self._poisoned(ctx, super().client_begin(ctx))


@pytest.mark.parametrize("kind", ["ferret", "fedkseed"])
def test_shared_randomness_clients_and_server_agree_on_the_round_each_client_holds(kind):
    data = least_squares_data(dtype=torch.float32)  # the shared bases are float32
    local = {"steps": 3, "batch_size": 10, "lr": 0.01}
    if kind == "ferret":
        algorithm = LossyFerret(FerretConfig(fraction=0.6, max_bases_per_block=2, local=local))
    else:
        algorithm = LossyFedKSeed(FedKSeedConfig(fraction=0.6, seeds=8, epsilon=1e-3, local=local))
    models = {}
    start_params = clone(start(algorithm, data).params)
    models[0] = start_params
    _, state = lossy_run(algorithm, data, 12, replay_invariant(data, models))
    assert not torch.equal(state.params["w"], start_params["w"])  # the model did move


def test_a_dropped_uplink_leaves_the_client_state_as_it_was_and_silence_stores_at_once():
    data = least_squares_data()
    scaffold = Scaffold(ScaffoldConfig(fraction=1.0, local=LOCAL))
    fed = federation(scaffold, data)
    state, _ = fed.run_round(start(scaffold, data), 1)
    store = fed.executor.pipeline.store
    before = {c: store.get(c)["c/w"].clone() for c in range(5)}
    fed.executor.pipeline.channel.drop = {Direction.UP: 1.0, Direction.DOWN: 0.0}
    after, report = fed.run_round(state, 2)
    assert report.accepted == [] and torch.equal(after.control["w"], state.control["w"])
    assert all(torch.equal(store.get(c)["c/w"], before[c]) for c in range(5))

    # Event-based ADMM: a silent agent (trigger below Delta) has sent nothing, so its new state
    # (dual, x_hat) is stored at once, and the server's copy stays its last sent vector.
    admm = LossyADMM(EventADMMConfig(rho=2.0, delta=1e9))
    fed = federation(admm, data)
    state, _ = fed.run_round(start(admm, data), 1)
    store = fed.executor.pipeline.store
    assert all(
        store.get(c) is not None and torch.equal(store.get(c)["last/w"], state.z["w"]) for c in range(5)
    )
    assert any(not torch.equal(store.get(c)["x_hat/w"], state.z["w"]) for c in range(5))


def test_a_skipped_round_commits_no_client_state():
    """Finite updates can overflow when aggregated: the round is skipped (run as if nothing had
    arrived), and no client's new state takes effect, since the server applied none of them."""
    data = least_squares_data()
    scaffold = HugeScaffold(ScaffoldConfig(fraction=1.0, local=LOCAL, server_lr=2.0))
    fed = federation(scaffold, data)
    state, _ = fed.run_round(start(scaffold, data), 1)
    store = fed.executor.pipeline.store
    before = {c: store.get(c)["c/w"].clone() for c in range(5)}
    scaffold.huge = True
    after, report = fed.run_round(state, 2)
    assert report.skipped == "the aggregate made params.w non-finite (3 NaN/Inf values)"
    assert torch.equal(after.params["w"], state.params["w"])
    assert torch.equal(after.control["w"], state.control["w"])
    assert all(torch.equal(store.get(c)["c/w"], before[c]) for c in range(5))


class HugeScaffold(Scaffold):
    """Once ``huge``, every client reports dy = max / (2 W), W the population's weight: finite and
    below the bound at which one update alone is rejected (engine/validation.py), but the server
    then steps with eta_g = 1e6, and x + eta_g mean(dy) overflows."""

    huge = False

    def client_end(self, ctx, work, result):
        out = super().client_end(ctx, work, result)
        if not self.huge:
            return out
        dy = out.uplink.arrays["dy/w"]
        large = np.finfo(dy.dtype).max / (2 * self.total_weight)
        arrays = {**out.uplink.arrays, "dy/w": np.full_like(dy, large)}
        return ClientOutput(Message(arrays, dict(out.uplink.meta)), out.state, out.info)

    def aggregate(self, state, round, accumulated):
        if self.huge:
            self.config = self.config.model_copy(update={"server_lr": 1e6})
        return super().aggregate(state, round, accumulated)
