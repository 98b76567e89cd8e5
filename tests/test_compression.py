"""Compression on the links of a federation (compression/link.py, engine/pipeline.py): the bytes the
ledger counts, error feedback reaching the optimum where the compressor alone stalls, the
acceptance rule for the links' state, DP's order, the config's refusals, executors and resume."""

import json

import numpy as np
import pytest
import torch

from taciturn.algorithms.base import ArraySpec, Arrival
from taciturn.algorithms.event_admm import EventADMM, EventADMMConfig
from taciturn.algorithms.fedavg import FedAvg, FedAvgConfig
from taciturn.compression.config import CompressionConfig
from taciturn.compression.link import DOWN, UP, Uplink
from taciturn.core import Channel, Direction, Ledger, Message, Streams
from taciturn.deploy.settings import refuse_undeployable
from taciturn.experiments.config import ConfigError
from taciturn.experiments.runner import resume, start
from taciturn.privacy.gaussian import LocalGaussian
from taciturn.privacy.noise import GaussianNoise
from taciturn.report.rundir import RunDir
from tests.conftest import tiny_config
from tests.quadratic import ExactXUpdate, federation, least_squares_data, optimum, run


def safetensors_size(header: dict, payload: int) -> int:
    """8 bytes of length, the compact JSON header padded with spaces to a multiple of 8, the data."""
    text = json.dumps(header, separators=(",", ":"))
    return 8 + -(-len(text) // 8) * 8 + payload


def test_the_ledger_counts_the_compressed_form_to_the_byte():
    x = np.zeros(300, np.float32)
    x[[7, 42, 250]] = [3.0, -2.0, 0.5]  # the 1% top-k of 300 values: k = 3
    x[100] = 0.25
    uplink = Uplink(
        CompressionConfig(up=[{"kind": "topk", "fraction": 0.01}, "fp16"]).transform("up"), Streams(0)
    )
    sent, _ = uplink.send(1, 0, Message({"w": x}, {"num_samples": 5}), {})
    ledger = Ledger()
    arrived = Channel(ledger, Streams(0)).send(Direction.UP, 1, 0, sent)
    header = {
        "__metadata__": {
            "taciturn": json.dumps({"num_samples": 5, "w#": "float32:300"}, separators=(",", ":"))
        },
        "w#i": {"dtype": "U16", "shape": [3], "data_offsets": [0, 6]},
        "w#v#h": {"dtype": "F16", "shape": [3], "data_offsets": [6, 12]},
    }
    # 3 uint16 indices and 3 float16 values: 12 bytes of data against 1,200 for the float32 array;
    # the 187-character header pads to 192: 8 + 192 + 12
    assert ledger.totals(Direction.UP).bytes_sent == safetensors_size(header, 12) == 212
    back = uplink.receive(1, 0, arrived, {"w": ArraySpec((300,), np.dtype(np.float32))})
    expected = np.zeros(300, np.float32)
    expected[[7, 42, 250]] = [3.0, -2.0, 0.5]
    assert np.array_equal(back.arrays["w"], expected) and back.meta == {"num_samples": 5}


def test_a_federation_sends_and_counts_the_compressed_uplink_and_one_encoded_broadcast():
    data = least_squares_data(num_clients=3, dim=300, sizes=(400, 500, 450), dtype=torch.float32)
    config = FedAvgConfig(fraction=1.0, local={"steps": 1, "batch_size": 1000, "lr": 0.01})
    compression = {"up": [{"kind": "topk", "fraction": 0.01}], "down": ["int8"]}
    fed = federation(FedAvg(config), data, compression=compression)
    algorithm = fed.algorithm
    state = algorithm.init_server({"w": torch.zeros(300)}, 3)
    seen = []
    fed.executor.pipeline.channel.send = spy(fed.executor.pipeline.channel.send, seen)
    fed.run_round(state, 1)
    ups = [m for d, m in seen if d == Direction.UP]
    downs = [m for d, m in seen if d == Direction.DOWN]
    assert all(m is downs[0] for m in downs)  # one broadcast: compressed once, sent three times
    assert {n: a.dtype.name for n, a in downs[0].arrays.items()} == {"w#q": "int8", "w#s": "float32"}
    assert [sorted(m.arrays) for m in ups] == [["w#i", "w#v"]] * 3
    ledger = fed.executor.pipeline.channel.ledger
    assert ledger.totals(Direction.UP).bytes_sent == sum(len(encode(m)) for m in ups)
    assert ledger.totals(Direction.DOWN).bytes_sent == 3 * len(encode(downs[0]))
    # payload: 3 indices (uint16) and 3 values (float32) up; 300 int8 codes and 5 scales down
    assert [sum(a.nbytes for a in m.arrays.values()) for m in ups] == [18] * 3
    assert sum(a.nbytes for a in downs[0].arrays.values()) == 300 + 5 * 4


def encode(message):
    from taciturn.core.codec import encode as codec_encode

    return codec_encode(message)


def spy(send, seen):
    def wrapped(direction, round, client, message):
        seen.append((direction, message))
        return send(direction, round, client, message)

    return wrapped


def fedavg_error(compression, rounds, **fed_kwargs):
    data = least_squares_data()
    config = FedAvgConfig(fraction=1.0, local={"steps": 1, "batch_size": 1000, "lr": 0.05})
    algorithm = FedAvg(config)
    fed = federation(algorithm, data, compression=compression, **fed_kwargs)
    state = run(fed, algorithm.init_server({"w": torch.zeros(3, dtype=torch.float64)}, 5), rounds)
    return float(torch.linalg.norm(state.params["w"] - optimum(data))), fed


TOPK = [{"kind": "topk", "fraction": 0.3}]  # one of the three coordinates: ceil(0.3 * 3) = 1


def test_ef21_reaches_the_least_squares_optimum_where_top_k_alone_stalls():
    # full-batch FedAvg with one local step is gradient descent on sum_i p_i f_i: exact at 100 rounds
    exact, _ = fedavg_error(None, 100)
    assert exact < 1e-10
    stalled = [fedavg_error({"up": TOPK}, rounds)[0] for rounds in (100, 200)]
    assert stalled[0] > 0.5 and stalled[1] > 0.99 * stalled[0]  # stuck far from the optimum
    ef21, fed = fedavg_error({"up": TOPK, "up_feedback": "ef21"}, 100)
    assert ef21 < 1e-10
    # the memory gets closer but circles the optimum: the clients' gradients there differ and do
    # not vanish, so its residuals never drain (EF21's messages do: they are differences)
    memory, _ = fedavg_error({"up": TOPK, "up_feedback": "memory"}, 200)
    assert 0.01 < memory < stalled[1]
    # every message carries one value and one index, whatever the feedback
    assert fed.executor.pipeline.channel.ledger.totals(Direction.UP).messages_sent == 500


def test_scaffold_with_top_k_and_the_memory_reaches_the_optimum_and_ef21_would_not():
    """SCAFFOLD's server sums dc into c: the memory keeps that sum exact up to what it holds (it
    drains: each client's dy and dc vanish at SCAFFOLD's fixed point); EF21's per-message estimate
    leaves c off for good, which is why the config refuses it."""
    from taciturn.algorithms.scaffold import Scaffold, ScaffoldConfig

    data = least_squares_data()
    local = {"steps": 5, "batch_size": 1000, "lr": 0.05}  # local steps: FedAvg would drift, SCAFFOLD not

    def error(compression):
        scaffold = Scaffold(ScaffoldConfig(fraction=1.0, option="II", local=local))
        fed = federation(scaffold, data, compression=compression)
        state = run(fed, scaffold.init_server({"w": torch.zeros(3, dtype=torch.float64)}, 5), 150)
        return float(torch.linalg.norm(state.params["w"] - optimum(data)))

    assert error(None) < 1e-10
    assert error({"up": TOPK}) > 0.1
    assert error({"up": TOPK, "up_feedback": "memory"}) < 1e-10
    assert error({"up": TOPK, "up_feedback": "ef21"}) > 0.1


def test_ef21p_on_the_downlink_reaches_the_optimum_with_a_top_k_broadcast():
    error, fed = fedavg_error({"down": TOPK, "down_feedback": "ef21p"}, 100)
    assert error < 1e-10
    seen = []
    fed.executor.pipeline.channel.send = spy(fed.executor.pipeline.channel.send, seen)
    fresh = fed.algorithm.init_server({"w": torch.zeros(3, dtype=torch.float64)}, 5)
    fed.downlink.copies = {}  # as at the start: no client holds a reference yet
    fed.executor.pipeline.store = type(fed.executor.pipeline.store)()
    state = run(fed, fresh, 2)
    downs = [sorted(m.arrays) for d, m in seen if d == Direction.DOWN]
    assert downs == [["w"]] * 5 + [["w#i", "w#v"]] * 5  # the model first, then the top-1 of its change
    assert state is not None


def test_the_memory_keeps_exactly_what_compression_dropped():
    # Stich et al. 2018: what was sent plus the memory equals what was meant, message after message
    uplink = Uplink(CompressionConfig(up=TOPK, up_feedback="memory").transform("up"), Streams(0))
    rng, held, meant, sent_total = np.random.default_rng(0), {}, np.zeros(3), np.zeros(3)
    for round in range(1, 6):
        x = rng.normal(size=3)
        sent, held = uplink.send(round, 0, Message({"w": x}), held)
        back = uplink.receive(round, 0, sent, {"w": ArraySpec((3,), x.dtype)}).arrays["w"]
        assert np.count_nonzero(back) == 1
        meant, sent_total = meant + x, sent_total + back
        np.testing.assert_allclose(sent_total + held[UP + "w"].numpy(), meant, rtol=0, atol=1e-12)


class RejectClient0(FedAvg):
    def check_uplink_meta(self, message):
        return "rejected by the test" if message.meta["num_samples"] == 20 else None  # client 0 holds 20


@pytest.mark.parametrize("feedback", ["memory", "ef21"])
def test_a_lost_or_rejected_uplink_leaves_the_memory_and_the_servers_copy_as_they_were(feedback):
    data = least_squares_data()
    config = FedAvgConfig(fraction=1.0, local={"steps": 1, "batch_size": 1000, "lr": 0.05})
    fed = federation(RejectClient0(config), data, compression={"up": TOPK, "up_feedback": feedback})
    store, uplink = fed.executor.pipeline.store, fed.uplink
    state = run(fed, fed.algorithm.init_server({"w": torch.zeros(3, dtype=torch.float64)}, 5), 1)
    assert store.get(0) is None  # client 0's update was rejected: nothing of it was kept
    before = {c: store.get(c)[UP + "w"].clone() for c in range(1, 5)}
    assert all(torch.count_nonzero(m) > 0 for m in before.values())
    if feedback == "ef21":  # the server's copy of each reference is the client's, and none for client 0
        assert sorted(uplink.copies) == [1, 2, 3, 4]
        assert all(np.array_equal(uplink.copies[c]["w"], before[c].numpy()) for c in before)
    fed.executor.pipeline.channel.drop[Direction.UP] = 1.0  # every uplink of round 2 is lost
    state = run(fed, state, 1, first=2)
    assert all(torch.equal(store.get(c)[UP + "w"], before[c]) for c in before)
    if feedback == "ef21":
        assert all(np.array_equal(uplink.copies[c]["w"], before[c].numpy()) for c in before)


class ExactEventADMM(ExactXUpdate, EventADMM):
    pass


def test_event_admm_sending_compressed_changes_with_memory_is_ef21_and_reaches_the_optimum():
    """uplink = "change" and the memory: e_i = last_i - s_i, so C(r_i + e_i) = C(v_i - s_i) (EF21)."""
    data = least_squares_data()

    def error(compression, rounds=250, drop=0.0):
        algorithm = ExactEventADMM(EventADMMConfig(rho=2.0, uplink="change"))
        fed = federation(algorithm, data, compression=compression, drop_up=drop, drop_down=drop)
        state = run(fed, algorithm.init_server({"w": torch.zeros(3, dtype=torch.float64)}, 5), rounds)
        for c in range(5) if "up_feedback" in compression else ():
            # the invariant: the server's copy is what the agent meant to send minus its memory
            held = fed.executor.pipeline.store.get(c)
            torch.testing.assert_close(
                state.copies["w"][c], held["last/w"] - held[UP + "w"], rtol=0, atol=1e-12
            )
        return float(torch.linalg.norm(state.z["w"] - optimum(data)))

    assert error({"up": TOPK}) > 0.1  # top-k of the change alone: a wrong fixed point
    assert error({"up": TOPK, "up_feedback": "memory"}) < 1e-9
    assert error({"up": TOPK, "up_feedback": "memory"}, rounds=300, drop=0.3) < 1e-6  # slower, not biased


def test_ef21p_copies_on_both_sides_agree_whatever_the_channel_loses():
    data = least_squares_data()
    algorithm = ExactEventADMM(EventADMMConfig(rho=2.0, delta=0.01, delta_z=0.001, downlink="per_client"))
    compression = {"down": [*TOPK, "fp16"], "down_feedback": "ef21p"}
    fed = federation(algorithm, data, compression=compression, drop_up=0.3, drop_down=0.3)
    state = algorithm.init_server({"w": torch.zeros(3, dtype=torch.float64)}, 5)
    for round in range(1, 31):
        state = run(fed, state, 1, first=round)
        for c in range(5):
            held = fed.executor.pipeline.store.get(c)
            client_copy = None if held is None else held.get(DOWN + "w")
            server_copy = fed.downlink.copies.get(c, {}).get("w")
            assert (client_copy is None) == (server_copy is None)
            if server_copy is not None:
                assert np.array_equal(client_copy.numpy(), server_copy)


def test_compression_comes_after_local_dp_noise():
    """Local DP releases clip-and-noise of the delta; compressing that release is post-processing."""
    data = least_squares_data()
    config = FedAvgConfig(fraction=1.0, local={"steps": 1, "batch_size": 1000, "lr": 0.05})

    def arrivals(compression, dp=True):
        fed = federation(FedAvg(config), data, compression=compression)
        fed.executor.pipeline.local_dp = (
            LocalGaussian(1.0, 0.1, "", Streams(0), GaussianNoise(reproducible=True)) if dp else None
        )
        fed.executor.pipeline.keep_arrivals = True
        _, report = fed.run_round(fed.algorithm.init_server({"w": torch.zeros(3, dtype=torch.float64)}, 5), 1)
        return [a.message.arrays["w"] for a in report.arrivals]

    noised, cast, plain = arrivals(None), arrivals({"up": ["fp16"]}), arrivals(None, dp=False)
    assert all(
        np.array_equal(c, n.astype(np.float16).astype(np.float64)) for c, n in zip(cast, noised, strict=True)
    )
    assert not any(np.allclose(n, p, atol=1e-3) for n, p in zip(noised, plain, strict=True))  # noise is there


# ----- the config: which combinations hold -----
def refusal(**overrides):
    with pytest.raises(ConfigError) as error:
        tiny_config(**overrides)
    return str(error.value)


def test_combinations_that_do_not_hold_are_refused_before_work():
    assert "secagg.bits" in refusal(secagg={"enabled": True}, compression={"up": ["fp16"]})
    assert "robust rule" in refusal(aggregation={"kind": "median"}, compression={"up": ["topk"]})
    assert "robust rule" in refusal(
        aggregation={"kind": "krum"}, compression={"up": ["int8"], "up_feedback": "memory"}
    )
    assert "down_feedback = 'ef21p'" in refusal(compression={"down": ["qsgd"]})
    assert "algorithm.uplink = 'change'" in refusal(
        algorithm={"name": "event_admm"}, compression={"up": ["topk"]}
    )
    event_memory = refusal(
        algorithm={"name": "fedadmm"}, compression={"up": ["fp16"], "up_feedback": "memory"}
    )
    assert "carries values" in event_memory
    assert "must arrive exactly" in refusal(algorithm={"name": "fedkseed"}, compression={"down": ["fp16"]})
    assert "needs an uplink chain" in refusal(compression={"up_feedback": "ef21"})
    assert "running sum" in refusal(
        algorithm={"name": "scaffold"}, compression={"up": ["topk"], "up_feedback": "ef21"}
    )
    assert "did you mean 'topk'" in refusal(compression={"up": ["tpok"]})
    assert "did you mean 'fraction'" in refusal(compression={"up": [{"kind": "topk", "fracton": 0.1}]})
    assert "a sparsifier (topk, randk)" in refusal(compression={"up": ["fp16", "randk"]})


def test_combinations_that_hold_validate():
    tiny_config(aggregation={"kind": "median"}, compression={"up": ["int8"]})  # per-value error only
    tiny_config(
        privacy={"enabled": True, "noise_multiplier": 1.0},
        compression={"up": ["topk"], "up_feedback": "ef21"},
    )
    tiny_config(
        privacy={"enabled": True, "noise_multiplier": 1.0, "mode": "local"}, compression={"up": ["qsgd"]}
    )
    tiny_config(secagg={"enabled": True}, compression={"down": ["bf16"]})  # the broadcast is not masked
    tiny_config(
        algorithm={"name": "event_admm", "uplink": "change"},
        compression={"up": ["topk"], "up_feedback": "memory"},
    )
    tiny_config(algorithm={"name": "ferret"}, compression={"up": ["fp16"]}, model={"kind": "mlp"})


def test_executors_that_cannot_keep_the_server_copies_and_deployments_refuse_clearly():
    config = tiny_config(compression={"up": ["topk"], "up_feedback": "ef21"}, engine={"executor": "parallel"})
    with pytest.raises(ConfigError, match="'sequential' or 'vectorized'"):
        _build(config)
    with pytest.raises(ConfigError, match="simulation only"):
        refuse_undeployable(tiny_config(compression={"down": ["fp16"]}))


def _build(config):
    import tempfile
    from pathlib import Path

    from taciturn.experiments.runner import prepare

    with tempfile.TemporaryDirectory() as folder:
        prepare(config, Path(folder) / "run")


def metrics_without_time(rundir):
    return [{k: v for k, v in row.items() if k != "wall_s"} for row in rundir.read_metrics()]


def test_sequential_parallel_and_vectorized_executors_agree_on_compressed_runs(tmp_path):
    compression = {
        "up": [{"kind": "randk", "fraction": 0.3}, "int8"],
        "up_feedback": "memory",
        "down": ["bf16"],
    }
    runs = {
        executor: start(
            tiny_config(compression=compression, engine={"executor": executor, "workers": 2}),
            tmp_path / executor,
            progress=False,
        )
        for executor in ("sequential", "parallel", "vectorized")
    }
    ledgers = {name: run.ledger.read_text() for name, run in runs.items()}
    assert (
        ledgers["parallel"] == ledgers["sequential"] == ledgers["vectorized"]
    )  # bytes do not depend on where
    rows = {name: metrics_without_time(run) for name, run in runs.items()}
    assert rows["parallel"] == rows["sequential"]
    for a, b in zip(rows["vectorized"], rows["sequential"], strict=True):
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=0.02)


class Stop(Exception):
    pass


@pytest.mark.parametrize(
    ("algorithm", "compression"),
    [
        (
            {"name": "fedavg", "fraction": 0.5},
            {"up": ["topk"], "up_feedback": "ef21", "down": ["qsgd"], "down_feedback": "ef21p"},
        ),
        (  # sampled agents, the per-agent downlink trigger, changes with memory
            {"name": "event_admm", "fraction": 0.5, "delta": 0.05, "start": "common", "uplink": "change"},
            {"up": ["randk"], "up_feedback": "memory", "down": ["int4"]},
        ),
    ],
    ids=["fedavg", "event_admm"],
)
def test_a_resumed_compressed_run_ends_with_the_numbers_of_an_uninterrupted_one(
    tmp_path, algorithm, compression
):
    config = tiny_config(
        rounds=5, algorithm=algorithm, compression=compression, channel={"drop_up": 0.2, "drop_down": 0.2}
    )
    whole = start(config, tmp_path / "whole", progress=False)

    def stop(end):
        if end.round == 3:
            raise Stop

    with pytest.raises(Stop):
        start(config, tmp_path / "cut", progress=False, callbacks=(stop,))
    assert RunDir(tmp_path / "cut").latest_checkpoint()[0] == 2
    resumed = resume(tmp_path / "cut", progress=False)
    assert metrics_without_time(resumed) == metrics_without_time(whole)
    assert resumed.ledger.read_text() == whole.ledger.read_text()


def test_aggregate_sees_the_rebuilt_update():
    """The algorithm only ever sees what the client meant (rebuilt), never the compressed parts."""
    data = least_squares_data()
    algorithm = FedAvg(FedAvgConfig(fraction=1.0, local={"steps": 1, "batch_size": 1000, "lr": 0.05}))
    fed = federation(algorithm, data, compression={"up": ["bf16"]})
    seen = []
    accumulate = algorithm.accumulate
    algorithm.accumulate = lambda arrivals: seen.extend(arrivals) or accumulate(arrivals)
    run(fed, algorithm.init_server({"w": torch.zeros(3, dtype=torch.float64)}, 5), 1)
    assert seen and all(isinstance(a, Arrival) and set(a.message.arrays) == {"w"} for a in seen)
    assert all(a.message.arrays["w"].dtype == np.float64 for a in seen)
