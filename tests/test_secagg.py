"""Secure aggregation: exact sums, dropout recovery, masked vectors that say nothing, bytes counted."""

import contextlib

import numpy as np
import pytest

from taciturn.core.channel import Channel
from taciturn.core.codec import encode
from taciturn.core.ledger import Direction, Ledger
from taciturn.core.message import Message
from taciturn.core.rng import Streams
from taciturn.experiments.config import ConfigError
from taciturn.experiments.runner import start
from taciturn.secagg import crypto
from taciturn.secagg.config import SecAggConfig, SecAggFailed
from taciturn.secagg.protocol import SecureSum, harary
from taciturn.secagg.quantize import dequantize_sum, levels, quantize
from tests.conftest import tiny_config

CLIENTS = [2, 3, 5, 8, 11, 13]


def inputs(dim=500, bits=16, seed=0):
    rng = np.random.default_rng(seed)
    return {c: rng.integers(0, 2**bits, size=dim).astype(np.uint32) for c in CLIENTS}


def secure(graph="complete", k=4, drop_up=0.0):
    ledger = Ledger()
    channel = Channel(ledger, Streams(0), drop_up=drop_up)
    return SecureSum(SecAggConfig(enabled=True, graph=graph, neighbours=k), Streams(7)), channel, ledger


@pytest.mark.parametrize("graph", ["complete", "sparse"])
def test_the_unmasked_sum_equals_the_quantised_sum_exactly(graph):
    xs = inputs()
    secagg, channel, _ = secure(graph)
    survivors, total = secagg.run(channel, 1, xs)
    assert survivors == CLIENTS
    assert np.array_equal(total, np.sum([xs[c] for c in CLIENTS], axis=0, dtype=np.uint64).astype(np.uint32))


@pytest.mark.parametrize("graph", ["complete", "sparse"])
def test_a_client_dropping_after_the_share_round_leaves_the_others_sum(graph):
    xs = inputs()
    secagg, channel, _ = secure(graph)
    survivors, total = secagg.run(channel, 1, xs, silent_after_shares={5})
    assert survivors == [2, 3, 8, 11, 13]
    assert np.array_equal(
        total, np.sum([xs[c] for c in survivors], axis=0, dtype=np.uint64).astype(np.uint32)
    )


def test_too_few_survivors_to_rebuild_a_secret_fail_cleanly():
    secagg, channel, _ = secure("sparse", k=2)  # t = 2 of 2 neighbours: one dropout is too many
    with pytest.raises(SecAggFailed, match="needed"):
        secagg.run(channel, 1, inputs(), silent_after_shares={5})


def test_sums_wrap_exactly_mod_2_to_the_32():
    xs = {c: np.full(10, 2**32 - 1 - c, np.uint32) for c in CLIENTS}
    secagg, channel, _ = secure()
    _, total = secagg.run(channel, 1, xs)
    assert total.tolist() == [sum(2**32 - 1 - c for c in CLIENTS) % 2**32] * 10


def test_a_masked_vector_is_uncorrelated_with_its_update():
    xs = inputs(dim=20000)
    secagg, channel, _ = secure()
    seen = {}
    send = channel.send

    def spy(direction, round, client, message):
        if message.meta.get("secagg") == "masked":
            seen[client] = message.arrays["y"]
        return send(direction, round, client, message)

    channel.send = spy
    secagg.run(channel, 1, xs)
    y, x = seen[5].astype(np.float64), xs[5].astype(np.float64)
    assert abs(np.corrcoef(x, y)[0, 1]) < 0.03
    assert y.mean() == pytest.approx(2**31, rel=0.02)  # uniform over the ring, not over the inputs' range


def test_every_protocol_message_is_in_the_ledger():
    dim = 300
    secagg, channel, ledger = secure()
    secagg.run(channel, 1, inputs(dim=dim))
    up, down = ledger.totals(Direction.UP), ledger.totals(Direction.DOWN)
    n = len(CLIENTS)
    assert up.messages_sent == 4 * n and down.messages_sent == 3 * n  # keys, shares, masked, unmask; 3 down
    masked = len(encode(Message({"y": np.zeros(dim, np.uint32)}, {"secagg": "masked"})))
    keys = len(
        encode(
            Message(
                {"c_pk": np.zeros((1, 32), np.uint8), "s_pk": np.zeros((1, 32), np.uint8)}, {"secagg": "keys"}
            )
        )
    )
    assert up.bytes_sent > n * (masked + keys) and masked > 4 * dim


def test_uplink_drops_are_dropouts_and_the_sum_stays_exact():
    xs = inputs()
    secagg, channel, _ = secure(drop_up=0.08)
    survivors, total = secagg.run(channel, 3, xs)
    assert 0 < len(survivors) <= len(CLIENTS)
    assert np.array_equal(
        total, np.sum([xs[c] for c in survivors], axis=0, dtype=np.uint64).astype(np.uint32)
    )


def test_harary_graph_is_k_regular_and_symmetric():
    graph = harary(list(range(10)), 4, np.random.default_rng(0))
    assert all(len(vs) == 4 for vs in graph.values())
    assert all(u in graph[v] for u, vs in graph.items() for v in vs)


def test_quantisation_round_trips_within_half_a_step_per_client():
    level = levels(10, 16)
    rng = np.random.default_rng(1)
    xs = [rng.uniform(-0.2, 0.2, 1000) for _ in range(10)]
    total = np.sum([quantize(x, 0.1, level) for x in xs], axis=0, dtype=np.uint64).astype(np.uint32)
    want = np.sum([np.clip(x, -0.1, 0.1) for x in xs], axis=0)
    assert np.abs(dequantize_sum(total, 0.1, level, 10) - want).max() <= 10 * 0.5 * (0.2 / level) + 1e-12
    with pytest.raises(ValueError, match="ring"):
        levels(2**17, 16)


def test_key_agreement_prg_and_shamir_round_trip():
    a, b = crypto.private_key(bytes(range(32))), crypto.private_key(bytes(range(1, 33)))
    assert crypto.agree(a, crypto.public_bytes(b), b"x") == crypto.agree(b, crypto.public_bytes(a), b"x")
    assert np.array_equal(crypto.prg(b"k" * 32, 9), crypto.prg(b"k" * 32, 9))
    shares = crypto.split(b"s" * 32, 3, 5)
    assert crypto.combine({1: shares[0], 4: shares[3], 5: shares[4]}) == b"s" * 32


def test_a_run_with_secure_aggregation_learns_and_pays_for_it(tmp_path):
    # SecAgg's server averages with equal weights (it cannot weight what it cannot see)
    plain = start(tiny_config(rounds=3, server={"weights": "equal"}), tmp_path / "plain", progress=False)
    plain = plain.read_metrics()
    config = tiny_config(rounds=3, secagg={"enabled": True, "clip": 1.0})
    secure_rows = start(config, tmp_path / "secagg", progress=False).read_metrics()
    for a, b in zip(secure_rows, plain, strict=True):  # the same run up to 16-bit quantisation
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-3)
    assert secure_rows[-1]["bytes_up"] > plain[-1]["bytes_up"]
    assert secure_rows[-1]["messages_up"] == 4 * plain[-1]["messages_up"]


def test_secagg_configs_that_cannot_work_fail_before_work():
    with pytest.raises(ConfigError, match="fedavg"):
        tiny_config(algorithm={"name": "scaffold"}, secagg={"enabled": True})
    with pytest.raises(ConfigError, match="only sum"):
        tiny_config(aggregation={"kind": "median"}, secagg={"enabled": True})


class DropOne(Channel):
    """A channel that loses exactly the messages of one SecAgg stage to or from one client."""

    def __init__(self, ledger, stage, victim):
        super().__init__(ledger, Streams(0))
        self.stage, self.victim = stage, victim

    def send(self, direction, round, client, message):
        if message.meta.get("secagg") == self.stage and client == self.victim:
            self.ledger.record(round, client, direction, len(encode(message)), delivered=False)
            return None
        return super().send(direction, round, client, message)


STAGES = {  # stage: whether the victim's input is still in the sum
    "keys": False,
    "peer_keys": False,
    "shares": False,
    "routed": False,  # issue 39: this one crashed the run with KeyError
    "masked": False,
    "unmask_request": True,
    "unmask": True,
}


@pytest.mark.parametrize("graph", ["complete", "sparse"])
@pytest.mark.parametrize("stage", STAGES)
def test_a_drop_at_any_stage_leaves_the_exact_sum_of_the_survivors(stage, graph):
    xs = inputs(dim=50)
    ledger = Ledger()
    secagg = SecureSum(SecAggConfig(enabled=True, graph=graph, neighbours=4), Streams(7))
    survivors, total = secagg.run(DropOne(ledger, stage, 5), 1, xs)
    assert (5 in survivors) == STAGES[stage]
    assert survivors == [c for c in CLIENTS if c != 5 or STAGES[stage]]
    want = np.sum([xs[c] for c in survivors], axis=0, dtype=np.uint64).astype(np.uint32)
    assert np.array_equal(total, want)
    lost = ledger.totals(Direction.UP).messages_sent - ledger.totals(Direction.UP).messages_delivered
    lost += ledger.totals(Direction.DOWN).messages_sent - ledger.totals(Direction.DOWN).messages_delivered
    assert lost == 1  # exactly the one message, counted as sent and not delivered


@pytest.mark.parametrize("graph", ["complete", "sparse"])
def test_random_drops_at_every_stage_give_the_exact_sum_or_secagg_failed(graph):
    """Per-message drops both ways: every run either unmasks the survivors' exact sum or fails
    with SecAggFailed (the pipeline then skips the round), never with another exception."""
    xs = inputs(dim=20)
    outcomes = {"sum": 0, "failed": 0}
    for seed in range(40):
        channel = Channel(Ledger(), Streams(seed), drop_up=0.15, drop_down=0.15)
        secagg = SecureSum(SecAggConfig(enabled=True, graph=graph, neighbours=4), Streams(seed))
        try:
            survivors, total = secagg.run(channel, 1, xs)
        except SecAggFailed:
            outcomes["failed"] += 1
            continue
        want = np.sum([xs[c] for c in survivors], axis=0, dtype=np.uint64).astype(np.uint32)
        assert len(survivors) >= 2 and np.array_equal(total, want)
        outcomes["sum"] += 1
    assert outcomes["sum"] > 0 and outcomes["failed"] > 0


def test_drops_hit_every_stage_not_only_the_first_message():
    """Issue 39: one drop draw per (round, client, direction) made all 499 drops of 200 rounds
    first-stage key messages, so share recovery never ran in simulation."""
    dropped: dict[str, int] = {}
    channel = Channel(Ledger(), Streams(3), drop_up=0.3)
    send = channel.send

    def spy(direction, round, client, message):
        got = send(direction, round, client, message)
        if got is None:
            dropped[message.meta["secagg"]] = dropped.get(message.meta["secagg"], 0) + 1
        return got

    channel.send = spy
    secagg = SecureSum(SecAggConfig(enabled=True), Streams(3))
    for round in range(1, 41):
        with contextlib.suppress(SecAggFailed):  # a failed round's drops count too
            secagg.run(channel, round, inputs(dim=10, seed=round))
    assert set(dropped) == {"keys", "shares", "masked", "unmask"}  # every uplink stage loses messages


def test_fewer_than_two_masked_inputs_are_not_unmasked():
    """The sum of one input is that input: the server stops before asking for any share."""
    xs = {c: x for c, x in inputs(dim=10).items() if c in (2, 3)}
    secagg, _, _ = secure()
    ledger = Ledger()
    with pytest.raises(SecAggFailed, match="fewer than two"):
        secagg.run(DropOne(ledger, "masked", 3), 1, xs)
    # keys, peer keys, shares, routed shares, one masked input: no unmasking request, no reply
    assert ledger.totals(Direction.DOWN).messages_sent == 2 * 2
    assert ledger.totals(Direction.UP).messages_sent == 2 * 2 + 2


def test_keys_and_masks_do_not_come_from_the_run_seed():
    """Two runs of the protocol with one seed: the same sum, other keys and other masked vectors
    (the seed is public; keys drawn from it would let anyone unmask every update)."""
    seen = []
    for _ in range(2):
        channel = Channel(Ledger(), Streams(0))
        masked, keys = {}, {}
        send = channel.send

        def spy(direction, round, client, message, masked=masked, keys=keys, send=send):
            if message.meta.get("secagg") == "masked":
                masked[client] = message.arrays["y"].copy()
            if message.meta.get("secagg") == "keys":
                keys[client] = message.arrays["c_pk"].tobytes()
            return send(direction, round, client, message)

        channel.send = spy
        _, total = SecureSum(SecAggConfig(enabled=True), Streams(7)).run(channel, 1, inputs(dim=100))
        seen.append((total, masked, keys))
    (t1, m1, k1), (t2, m2, k2) = seen
    assert np.array_equal(t1, t2)
    assert all(k1[c] != k2[c] and not np.array_equal(m1[c], m2[c]) for c in CLIENTS)


def test_a_secagg_run_with_drops_both_ways_finishes_and_no_statistic_bypasses_the_channel(tmp_path):
    config = tiny_config(
        rounds=4,
        algorithm={"name": "fedavg", "fraction": 0.75},
        channel={"drop_up": 0.2, "drop_down": 0.2},
        secagg={"enabled": True, "clip": 1.0},
    )
    rows = start(config, tmp_path / "run", progress=False).read_metrics()
    assert len(rows) == 5 and all(r["train_loss"] is None for r in rows)  # the server never saw one
