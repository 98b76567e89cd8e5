"""Ferret's projection (Eq. 8, Theorems 1-2), its wire format and its federated protocol."""

import math

import numpy as np
import pytest
import torch

from taciturn.algorithms.base import Arrival, ClientContext, LocalTraining, TrainResult
from taciturn.algorithms.ferret import Ferret, FerretConfig
from taciturn.algorithms.shared_bases import (
    Block,
    SharedBases,
    allocate_bases,
    basis_variance,
    generate_basis,
    group_blocks,
    project,
    reconstruct_into,
)
from taciturn.core import Message, Streams, encode
from taciturn.core.params import clone, flatten, sub
from taciturn.core.state_store import MemoryStateStore


def one_block(d):
    return [Block(("w",), ((d,),))]


def reconstruction(delta, counts, streams, round, blocks=None, cache_bytes=0):
    blocks = blocks or one_block(len(delta["w"]))
    bases = SharedBases(streams, cache_bytes)
    coords = project(delta, blocks, counts, bases, round)
    out = {k: torch.zeros_like(v) for k, v in delta.items()}
    reconstruct_into(out, blocks, counts, coords, bases, round, 1.0)
    return out


def test_basis_variance_is_the_truncated_normal_variance():
    # scipy's closed form is exact for small d; both tend to 1/(3d) (the spec checked 0.99987 at d=1e3)
    from scipy import stats

    for d in (1, 10, 1000):
        c = 1 / math.sqrt(d)
        assert basis_variance(d) == pytest.approx(stats.truncnorm(-c, c).var(), rel=1e-10)
    assert basis_variance(1000) * 3000 == pytest.approx(0.99987, abs=1e-5)
    assert basis_variance(10**9) * 3 * 10**9 == pytest.approx(1.0, abs=1e-8)  # no cancellation


def test_bases_are_truncated_to_the_unit_ball_and_have_the_stated_variance():
    d = 20_000
    v = generate_basis(Streams(0), 1, 0, 0, d)
    assert v.abs().max() <= 1 / math.sqrt(d) and float(v.norm()) <= 1.0
    assert float(v.var()) == pytest.approx(basis_variance(d), rel=0.03)


def test_client_and_server_regenerate_bit_identical_bases_and_blocks_never_share_them():
    a = generate_basis(Streams(7), 3, 2, 5, 1000)
    b = generate_basis(Streams(7), 3, 2, 5, 1000)
    assert torch.equal(a, b)
    for other in ((4, 2, 5), (3, 1, 5), (3, 2, 4)):  # another round, block or slot
        assert not torch.equal(a, generate_basis(Streams(7), *other, 1000))
    assert not torch.equal(a, generate_basis(Streams(8), 3, 2, 5, 1000))  # another run seed
    # equal-sized blocks get different bases (the official code reseeded and gave them the same one)
    assert not torch.equal(
        generate_basis(Streams(7), 3, 0, 0, 1000), generate_basis(Streams(7), 3, 1, 0, 1000)
    )


def test_theorem_1_the_mean_reconstruction_converges_to_the_update():
    d, K, n = 64, 4, 1500
    delta = {"w": torch.randn(d, generator=torch.Generator().manual_seed(0))}
    streams = Streams(1)
    mean = sum(reconstruction(delta, [K], streams, r, cache_bytes=10**6)["w"] for r in range(n)) / n
    # each reconstruction has relative error about sqrt(d/K) = 4; the mean of n has about 4/sqrt(n)
    err = float((mean - delta["w"]).norm() / delta["w"].norm())
    assert err < 4 * 4 / math.sqrt(n)
    single = float((reconstruction(delta, [K], streams, 0)["w"] - delta["w"]).norm() / delta["w"].norm())
    assert single > 10 * err


def test_cosine_between_reconstruction_and_update_is_about_sqrt_k_over_k_plus_d():
    # Fig. 7 of the paper: about 0.07 at d = 1e5, K = 500; here the same ratio, 5x smaller
    d, K = 20_000, 100
    delta = {"w": torch.randn(d, generator=torch.Generator().manual_seed(1))}
    cosines = []
    for r in range(3):
        rec = reconstruction(delta, [K], Streams(2), r, cache_bytes=10**8)["w"]
        cosines.append(float(torch.nn.functional.cosine_similarity(rec, delta["w"], dim=0)))
    assert np.mean(cosines) == pytest.approx(math.sqrt(K / (K + d)), rel=0.1)


def test_squared_error_falls_like_d_over_k():
    d = 2000
    delta = {"w": torch.randn(d, generator=torch.Generator().manual_seed(2))}

    def mse(K):
        errs = [
            float((reconstruction(delta, [K], Streams(3), r)["w"] - delta["w"]).pow(2).sum())
            for r in range(20)
        ]
        return np.mean(errs) / float(delta["w"].pow(2).sum())

    # E||D~ - D||^2 / ||D||^2 = (d + 1 - ...)/K for near-uniform bases: about d/K
    assert mse(10) == pytest.approx(d / 10, rel=0.2)
    assert mse(40) == pytest.approx(d / 40, rel=0.2)


def test_blockwise_projection_matches_the_formula_by_hand():
    delta = {"a": torch.tensor([1.0, 2.0, 3.0]), "b": torch.tensor([[4.0, -1.0]])}
    blocks = [Block(("a",), ((3,),)), Block(("b",), ((1, 2),))]
    bases = SharedBases(Streams(5))
    coords = project(delta, blocks, [2, 3], bases, 1)
    v = [
        [generate_basis(Streams(5), 1, l, k, n) for k in range(K)]
        for l, (n, K) in enumerate([(3, 2), (2, 3)])
    ]
    expected = [float(v[0][k] @ delta["a"]) / (basis_variance(3) * 2) for k in range(2)]
    expected += [float(v[1][k] @ delta["b"].reshape(-1)) / (basis_variance(2) * 3) for k in range(3)]
    torch.testing.assert_close(coords, torch.tensor(expected))


def test_grouping_rule_of_the_official_code():
    params = {
        "emb": torch.zeros(100, 10),  # 1000
        "n1": torch.zeros(10),
        "q": torch.zeros(10, 10),
        "n2": torch.zeros(10),
        "k": torch.zeros(10, 10),
        "head": torch.zeros(10, 100),
    }
    # median 100 -> target 90: a tensor that would push its block past 90 opens a new one
    blocks = group_blocks(params)
    assert [b.names for b in blocks] == [("emb",), ("n1",), ("q",), ("n2",), ("k",), ("head",)]
    params = {"a": torch.zeros(20), "b": torch.zeros(20), "c": torch.zeros(100), "d": torch.zeros(100)}
    assert [b.names for b in group_blocks(params)] == [("a", "b"), ("c",), ("d",)]  # target 54


def test_allocation_is_proportional_to_the_block_norm_with_at_least_two():
    assert allocate_bases([10.0, 5.0, 0.1, 0.0], 16) == [16, 8, 2, 2]
    assert allocate_bases([0.0, 0.0], 16) == [2, 2]
    assert allocate_bases([float("nan"), 1.0], 16) == [2, 2]


def make_ferret(params, num_clients=4, seed=0, **config):
    algorithm = Ferret(FerretConfig(max_bases_per_block=4, **config))
    algorithm.use_streams(Streams(seed))
    return algorithm, algorithm.init_server(params, num_clients)


def tiny_params(seed=0, width=30):
    g = torch.Generator().manual_seed(seed)
    return {
        "w1": torch.randn(width, 8, generator=g),
        "b1": torch.randn(width, generator=g),
        "w2": torch.randn(3, width, generator=g),
    }


def client_update(algorithm, state, round, client, delta_seed):
    """What client_end sends for a given local result, from the model it holds after catching up."""
    ctx = ClientContext(client, round, None, None, 10, algorithm.streams, None, None)
    work = LocalTraining(params=clone(state.params), consts={})
    g = torch.Generator().manual_seed(delta_seed)
    trained = {k: v - 0.01 * torch.randn(v.shape, generator=g) for k, v in work.params.items()}
    return algorithm.client_end(ctx, work, TrainResult(trained, None, 1, 0.5)), sub(work.params, trained)


def test_aggregating_coordinates_equals_averaging_reconstructions():
    params = tiny_params()
    algorithm, state = make_ferret(params, server_lr=0.7)
    outputs = [client_update(algorithm, state, 1, c, 10 + c) for c in range(3)]
    arrivals = [Arrival(c, out.uplink) for c, (out, _) in enumerate(outputs)]
    new = algorithm.aggregate(state, 1, arrivals)
    # the average of each client's own reconstruction, built slot by slot from its message alone
    bases = SharedBases(Streams(0))
    expected = clone(params)
    for out, _ in outputs:
        counts = out.uplink.arrays["counts"].astype(int).tolist()
        coords = torch.from_numpy(out.uplink.arrays["coords"])
        reconstruct_into(expected, algorithm.blocks, counts, coords, bases, 1, -0.7 / 3)
    for name in params:
        torch.testing.assert_close(new.params[name], expected[name], rtol=1e-5, atol=1e-6)
    # and Delta~ points along Delta: the server step correlates with the true mean update
    true = flatten({k: sum(d[k] for _, d in outputs) / 3 for k in params})
    step = flatten(sub(params, new.params))
    assert float(torch.nn.functional.cosine_similarity(step, true, dim=0)) > 0.05


def test_wire_message_is_o_k_whatever_the_model_size():
    sizes = {}
    for width in (30, 3000):  # same block structure, parameters x100
        params = tiny_params(width=width)
        algorithm, state = make_ferret(params)
        out, _ = client_update(algorithm, state, 1, 0, 1)
        counts = out.uplink.arrays["counts"].astype(int)
        assert len(out.uplink.arrays["coords"]) == counts.sum() <= 4 * len(counts)
        sizes[width] = (len(encode(out.uplink)), int(counts.sum()))
    model_bytes = {w: 4 * sum(v.numel() for v in tiny_params(width=w).values()) for w in sizes}
    assert model_bytes[3000] > 90 * model_bytes[30]
    for nbytes, n_coords in sizes.values():
        # 4 bytes a coordinate, 2 a block count, and a header of at most 200 bytes
        assert 4 * n_coords + 2 * 3 <= nbytes <= 4 * n_coords + 2 * 3 + 200


def test_the_shared_basis_cache_gives_bit_identical_numbers_with_fewer_generations():
    params = tiny_params()
    results = {}
    for share in (True, False):
        algorithm, state = make_ferret(params, share_bases=share)
        arrivals = [Arrival(c, client_update(algorithm, state, 1, c, c)[0].uplink) for c in range(3)]
        new = algorithm.aggregate(state, 1, arrivals)
        results[share] = (new.params, algorithm.bases.generated)
    for name in params:
        assert torch.equal(results[True][0][name], results[False][0][name])
    assert results[True][1] < results[False][1] / 3  # 3 clients + the server regenerated every basis


def test_a_client_that_skipped_rounds_catches_up_from_coordinates_to_the_servers_model():
    params = tiny_params()
    algorithm, state = make_ferret(params, num_clients=3)
    store = MemoryStateStore()
    for round in (1, 2, 3):  # client 0 trains in round 1 only; clients 1 and 2 in every round
        clients = [0, 1, 2] if round == 1 else [1, 2]
        downlink = algorithm.downlink(state, round, clients)
        arrivals = []
        for c in clients:
            message = Message(dict(downlink[c].arrays), dict(downlink[c].meta))
            ctx = ClientContext(c, round, message, store.get(c), 10, algorithm.streams, None, None)
            work = algorithm.client_begin(ctx)
            g = torch.Generator().manual_seed(100 * round + c)
            trained = {k: v - 0.01 * torch.randn(v.shape, generator=g) for k, v in work.params.items()}
            out = algorithm.client_end(ctx, work, TrainResult(trained, None, 1, 0.5))
            store.put(c, out.state)
            arrivals.append(Arrival(c, out.uplink))
        state = algorithm.aggregate(state, round, arrivals)
    down = algorithm.downlink(state, 4, [0])[0]
    assert down.meta["first_round"] == 1 and down.arrays["counts"].shape == (3, len(algorithm.blocks))
    ctx = ClientContext(0, 4, down, store.get(0), 10, algorithm.streams, None, None)
    caught_up = algorithm.client_begin(ctx).params
    for name in params:  # bit-identical: same operations, same order, same bases
        assert torch.equal(caught_up[name], state.params[name])
    assert len(encode(down)) < 4 * sum(v.numel() for v in params.values()) / 4  # far below a model


def test_variable_length_uplinks_validate_against_none_dimensions():
    from taciturn.algorithms.base import ArraySpec
    from taciturn.engine.validation import uplink_problem

    spec = {
        "counts": ArraySpec((3,), np.dtype(np.uint16)),
        "coords": ArraySpec((None,), np.dtype(np.float32)),
    }
    ok = Message({"counts": np.ones(3, np.uint16), "coords": np.zeros(7, np.float32)})
    assert uplink_problem(ok, spec) is None
    flat = Message({"counts": np.ones(3, np.uint16), "coords": np.zeros((7, 1), np.float32)})
    assert "shape" in uplink_problem(flat, spec)
    wide = Message({"counts": np.ones(3, np.uint16), "coords": np.zeros(7, np.float64)})
    assert uplink_problem(wide, spec) == "array 'coords' has dtype float64, expected float32"
    algorithm, _ = make_ferret(tiny_params())
    lying = Message(
        {"counts": np.array([2, 2, 2], np.uint16), "coords": np.zeros(5, np.float32)}, {"num_samples": 1}
    )
    assert "announced" in algorithm.check_uplink_meta(lying)
