"""Ferret's projection (Eq. 8, Theorems 1-2), its wire format and its federated protocol."""

import math

import numpy as np
import pytest
import torch

from taciturn.algorithms.base import Arrival, ClientContext, LocalTraining, TrainResult
from taciturn.algorithms.ferret import Ferret, FerretConfig
from taciturn.algorithms.shared_bases import (
    Bases,
    Block,
    Contribution,
    allocate_bases,
    apply_pieces,
    basis_variance,
    group_blocks,
)
from taciturn.core import Message, Streams, encode
from taciturn.core.params import clone, flatten, sub
from taciturn.core.rng import SERVER
from taciturn.core.state_store import MemoryStateStore


def one_block(d):
    return [Block(("w",), ((d,),))]


def reconstruct(bases, blocks, contributions, round, like):
    out = {k: torch.zeros_like(v) for k, v in like.items()}
    apply_pieces(out, blocks, bases.reconstruct(blocks, contributions, round), 1.0)
    return out


def reconstruction(delta, counts, streams, round, blocks=None, kind="uniform"):
    blocks = blocks or one_block(len(delta["w"]))
    bases = Bases(streams, kind)
    coords = bases.project(delta, blocks, counts, round, SERVER)
    return reconstruct(bases, blocks, [Contribution(SERVER, counts, coords)], round, delta)


def moments(kind, d):
    """(rho, mu4) of a basis element, from scipy where the distribution is not elementary."""
    c = 1 / math.sqrt(d)
    if kind == "uniform":
        return c**2 / 3, c**4 / 5
    from scipy import stats

    dist = stats.truncnorm(-c, c)
    return dist.var(), dist.moment(4)


KINDS = ("uniform", "truncated_normal")


def test_basis_variance_is_the_distributions_variance():
    # scipy's closed form is exact for small d; both tend to 1/(3d) (the spec checked 0.99987 at d=1e3)
    for d in (1, 10, 1000):
        assert basis_variance("truncated_normal", d) == pytest.approx(
            moments("truncated_normal", d)[0], rel=1e-10
        )
        assert basis_variance("uniform", d) == pytest.approx(moments("uniform", d)[0], rel=1e-15)
    assert basis_variance("truncated_normal", 1000) * 3000 == pytest.approx(0.99987, abs=1e-5)
    assert basis_variance("truncated_normal", 10**9) * 3 * 10**9 == pytest.approx(1.0, abs=1e-8)


@pytest.mark.parametrize("kind", KINDS)
def test_bases_lie_in_the_unit_ball(kind):
    # |v_i| <= c = 1/sqrt(d) in exact arithmetic, so ||v|| <= 1. In float32, c itself is rounded
    # (relative error <= 2^-24) and so is a + (b - a) u, once more (<= 2^-24): |v_i| <= c (1 + 2^-23),
    # hence ||v|| <= 1 + 2^-23, with the norm taken in float64 so that it adds no rounding of its own.
    d = 200_000  # more than one chunk
    v = Bases(Streams(0), kind).basis(1, SERVER, 0, 0, d)
    assert float(v.double().abs().max()) <= (1 + 2**-23) / math.sqrt(d)
    assert float(v.double().norm()) <= 1 + 2**-23


@pytest.mark.parametrize("kind", KINDS)
def test_second_moment_of_a_basis_is_rho_times_the_identity(kind):
    # E[v v^T] = rho I (what makes Eq. 8 unbiased), checked entry by entry within 5 standard errors:
    # a diagonal mean of n draws has sd sqrt((mu4 - rho^2) / n), an off-diagonal one rho / sqrt(n).
    d, n = 4, 4000  # small d: the truncated normal is visibly not uniform (c = 1/2)
    bases = Bases(Streams(3), kind)
    V = torch.stack([bases.basis(r, SERVER, 0, 0, d) for r in range(n)]).double()
    second = (V.T @ V / n).numpy()
    rho, mu4 = moments(kind, d)
    assert basis_variance(kind, d) == pytest.approx(rho, rel=1e-10)
    sd = np.where(np.eye(d, dtype=bool), math.sqrt(mu4 - rho**2), rho) / math.sqrt(n)
    assert (np.abs(second - rho * np.eye(d)) <= 5 * sd).all()


def test_client_and_server_regenerate_bit_identical_bases_and_blocks_never_share_them():
    def basis(seed, *key):
        return Bases(Streams(seed), "uniform").basis(*key)

    a = basis(7, 3, SERVER, 2, 5, 1000)
    assert torch.equal(a, basis(7, 3, SERVER, 2, 5, 1000))
    for other in ((4, SERVER, 2, 5), (3, SERVER, 1, 5), (3, SERVER, 2, 4), (3, 0, 2, 5)):
        assert not torch.equal(a, basis(7, *other, 1000))  # another round, block, slot or owner
    assert not torch.equal(a, basis(8, 3, SERVER, 2, 5, 1000))  # another run seed
    # equal-sized blocks get different bases (the official code reseeded and gave them the same one)
    assert not torch.equal(basis(7, 3, SERVER, 0, 0, 1000), basis(7, 3, SERVER, 1, 0, 1000))


@pytest.mark.parametrize("kind", KINDS)
def test_reconstruction_is_unbiased_with_the_exact_error_formula(kind):
    # Theorem 1, E[D~] = D, and E||D~_l - D_l||^2 = ||D_l||^2 (mu4/rho^2 + d_l - 2) / K_l per block,
    # each checked within 5 standard errors of the mean of n independent reconstructions.
    blocks = [Block(("a",), ((3,),)), Block(("b",), ((5, 8),))]
    counts = [2, 3]
    g = torch.Generator().manual_seed(0)
    delta = {"a": torch.randn(3, generator=g), "b": torch.randn(5, 8, generator=g)}
    n = 1000
    recs = [reconstruction(delta, counts, Streams(1), r, blocks, kind) for r in range(n)]
    for name, d, k in (("a", 3, 2), ("b", 40, 3)):
        samples = torch.stack([r[name].reshape(-1) for r in recs]).double()
        true = delta[name].reshape(-1).double()
        mean, se = samples.mean(0), samples.std(0) / math.sqrt(n)
        assert ((mean - true).abs() <= 5 * se).all()
        errors = (samples - true).pow(2).sum(1)
        rho, mu4 = moments(kind, d)
        expected = float(true.pow(2).sum()) * (mu4 / rho**2 + d - 2) / k
        assert float(errors.mean()) == pytest.approx(expected, abs=5 * float(errors.std()) / math.sqrt(n))


def test_cosine_between_reconstruction_and_update_is_about_sqrt_k_over_k_plus_d():
    # Fig. 7 of the paper: about 0.07 at d = 1e5, K = 500; here the same ratio, 5x smaller
    d, K = 20_000, 100
    delta = {"w": torch.randn(d, generator=torch.Generator().manual_seed(1))}
    cosines = []
    for r in range(3):
        rec = reconstruction(delta, [K], Streams(2), r)["w"]
        cosines.append(float(torch.nn.functional.cosine_similarity(rec, delta["w"], dim=0)))
    assert np.mean(cosines) == pytest.approx(math.sqrt(K / (K + d)), rel=0.1)


def test_blockwise_projection_matches_the_formula_by_hand():
    delta = {"a": torch.tensor([1.0, 2.0, 3.0]), "b": torch.tensor([[4.0, -1.0]])}
    blocks = [Block(("a",), ((3,),)), Block(("b",), ((1, 2),))]
    bases = Bases(Streams(5), "truncated_normal")
    coords = bases.project(delta, blocks, [2, 3], 1, SERVER)
    v = [[bases.basis(1, SERVER, l, k, n) for k in range(K)] for l, (n, K) in enumerate([(3, 2), (2, 3)])]
    rho = [basis_variance("truncated_normal", n) for n in (3, 2)]
    expected = [float(v[0][k] @ delta["a"]) / (rho[0] * 2) for k in range(2)]
    expected += [float(v[1][k] @ delta["b"].reshape(-1)) / (rho[1] * 3) for k in range(3)]
    torch.testing.assert_close(coords, torch.tensor(expected))
    # and reconstruction is V_l gamma_l, block by block
    rec = reconstruct(bases, blocks, [Contribution(SERVER, [2, 3], coords)], 1, delta)
    torch.testing.assert_close(rec["a"], sum(float(coords[k]) * v[0][k] for k in range(2)))
    torch.testing.assert_close(rec["b"].reshape(-1), sum(float(coords[2 + k]) * v[1][k] for k in range(3)))


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


@pytest.mark.parametrize("seeds", ["shared", "per_client"])
def test_the_server_step_is_the_average_of_the_clients_reconstructions(seeds):
    params = tiny_params()
    algorithm, state = make_ferret(params, server_lr=0.7, seeds=seeds)
    outputs = [client_update(algorithm, state, 1, c, 10 + c) for c in range(3)]
    arrivals = [Arrival(c, out.uplink) for c, (out, _) in enumerate(outputs)]
    new = algorithm.aggregate(state, 1, arrivals)
    # the average of each client's own reconstruction, built slot by slot from its message alone
    # (with shared bases the server pools coordinates instead: equal up to float rounding)
    bases = Bases(Streams(0), "uniform")
    expected = clone(params)
    for c, (out, _) in enumerate(outputs):
        counts = out.uplink.arrays["counts"].astype(int).tolist()
        coords = torch.from_numpy(out.uplink.arrays["coords"])
        owner = SERVER if seeds == "shared" else c
        pieces = bases.reconstruct(algorithm.blocks, [Contribution(owner, counts, coords)], 1)
        apply_pieces(expected, algorithm.blocks, pieces, -0.7 / 3)
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


def noise_of_the_average(seeds, updates, n):
    """Mean of ||(1/N) sum_i D~_i - mean_i D_i||^2 over n rounds: the aggregate's reconstruction error."""
    N, d = updates.shape
    blocks, bases = one_block(d), Bases(Streams(4), "uniform")
    errors = []
    for r in range(n):
        owners = [SERVER] * N if seeds == "shared" else list(range(N))
        gammas = [
            bases.project({"w": u}, blocks, [4], r, o) / N for u, o in zip(updates, owners, strict=True)
        ]
        if seeds == "shared":  # pooled slot by slot, as Ferret.aggregate does
            contributions = [Contribution(SERVER, [4], sum(gammas))]
        else:
            contributions = [Contribution(o, [4], g) for o, g in zip(owners, gammas, strict=True)]
        rec = reconstruct(bases, blocks, contributions, r, {"w": updates[0]})["w"]
        errors.append(float((rec.double() - updates.double().mean(0)).pow(2).sum()))
    return np.array(errors)


def test_shared_bases_are_up_to_n_times_noisier_than_per_client_seeds():
    # e(D) = ||D||^2 (mu4/rho^2 + d - 2) / K. Shared bases: E error = e(mean_i D_i); per-client
    # seeds (Alg. 1): (1/N^2) sum_i e(D_i). Identical updates: N times apart; orthogonal updates of
    # equal norm: equal. Each mean of n rounds within 5 standard errors of its formula.
    N, d, K, n = 4, 16, 4, 200
    factor = (9 / 5 + d - 2) / K  # uniform bases
    same = torch.ones(N, d)
    orthogonal = torch.eye(d)[:N] * 2.0
    for updates in (same, orthogonal):
        for seeds in ("shared", "per_client"):
            errors = noise_of_the_average(seeds, updates, n)
            if seeds == "shared":
                expected = factor * float(updates.mean(0).pow(2).sum())
            else:
                expected = factor * float(updates.pow(2).sum()) / N**2
            assert errors.mean() == pytest.approx(expected, abs=5 * errors.std() / math.sqrt(n))


def play_round(algorithm, state, store, round, clients):
    """One round of ``clients``, each training to a seeded random model; returns the server's new
    state and each client's LocalTraining (what it caught up to)."""
    downlink = algorithm.downlink(state, round, clients)
    arrivals, works = [], []
    for c in clients:
        message = Message(dict(downlink[c].arrays), dict(downlink[c].meta))
        ctx = ClientContext(c, round, message, store.get(c), 10, algorithm.streams, None, None)
        work = algorithm.client_begin(ctx)
        works.append(work)
        g = torch.Generator().manual_seed(100 * round + c)
        trained = {k: v - 0.01 * torch.randn(v.shape, generator=g) for k, v in work.params.items()}
        out = algorithm.client_end(ctx, work, TrainResult(trained, None, 1, 0.5))
        store.put(c, out.state)
        arrivals.append(Arrival(c, out.uplink))
    return algorithm.aggregate(state, round, arrivals), works


def run_with_a_skipping_client(seeds, cache_mib):
    """Three rounds; client 0 trains in round 1 only, then comes back in round 4 and catches up."""
    params = tiny_params()
    algorithm, state = make_ferret(params, num_clients=3, seeds=seeds, replay_cache_mib=cache_mib)
    store = MemoryStateStore()
    for round in (1, 2, 3):  # client 0 trains in round 1 only; clients 1 and 2 in every round
        state, _ = play_round(algorithm, state, store, round, [0, 1, 2] if round == 1 else [1, 2])
    down = algorithm.downlink(state, 4, [0])[0]
    ctx = ClientContext(0, 4, down, store.get(0), 10, algorithm.streams, None, None)
    return algorithm, state, down, algorithm.client_begin(ctx).params


def test_the_clients_of_a_round_share_one_caught_up_model_equal_to_the_servers():
    """replay.CaughtUp: in round 3, client 0 (holding w_0) replays rounds 1-2 and client 1 (holding
    w_1) would replay round 2; the second to come takes the first's tensors, which are the server's
    w_2 bit for bit, whichever client comes first."""
    for order in ([0, 1], [1, 0]):
        algorithm, state = make_ferret(tiny_params(), num_clients=2, replay_cache_mib=0)
        store = MemoryStateStore()
        state, _ = play_round(algorithm, state, store, 1, [0, 1])
        w2, _ = play_round(algorithm, state, store, 2, [1])
        assert [int(x) for x in w2.synced] == [0, 1]  # client 0 holds w_0, client 1 w_1
        _, (first, second) = play_round(algorithm, w2, store, 3, order)
        assert second.params is first.params  # one replay for the round, one copy in the states
        for name, value in w2.params.items():
            assert torch.equal(first.params[name], value)


@pytest.mark.parametrize("seeds", ["shared", "per_client"])
def test_a_client_that_skipped_rounds_catches_up_bit_identically_with_and_without_the_cache(seeds):
    results = {mib: run_with_a_skipping_client(seeds, mib) for mib in (0, 64)}
    for mib, (algorithm, state, down, caught_up) in results.items():
        assert down.meta["first_round"] == 1
        # one contribution a round with shared bases, one per client and round with per-client seeds
        rows = [1, 2, 3] if seeds == "shared" else [1, 1, 1, 2, 2, 3, 3]
        assert down.arrays["rounds"].tolist() == rows
        assert down.arrays["counts"].shape == (len(rows), len(algorithm.blocks))
        for name in caught_up:  # bit-identical: same operations, same order, same bases
            assert torch.equal(caught_up[name], state.params[name])
        # 3 rounds of coordinates travel in fewer bytes than one model (1,440 bytes here)
        assert len(encode(down)) < 4 * sum(v.numel() for v in caught_up.values())
        # with the cache, every catch-up of a round the server reconstructed is one add; rounds 2
        # and 3 replay once each (client 2 shares client 1's model: replay.CaughtUp), round 4 thrice
        assert algorithm.cache.hits == (0 if mib == 0 else 1 + 1 + 3)
    for name in results[0][3]:
        assert torch.equal(results[0][3][name], results[64][3][name])


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


def test_blocks_on_threads_give_the_numbers_of_one_thread(monkeypatch):
    from taciturn.algorithms import shared_bases

    params = tiny_params(width=300)
    blocks = group_blocks(params)
    counts = [4, 3, 2]
    assert len(blocks) == 3  # w1; b1; w2
    bases = Bases(Streams(6), "uniform")
    threads = torch.get_num_threads()
    results = []
    try:
        for n_threads, work in ((1, 1 << 40), (2, 0)):  # serial, then every block on a thread pool
            torch.set_num_threads(n_threads)
            monkeypatch.setattr(shared_bases, "PARALLEL_WORK", work)
            coords = bases.project(params, blocks, counts, 1, SERVER)
            results.append((coords, bases.reconstruct(blocks, [Contribution(SERVER, counts, coords)], 1)))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0][0], results[1][0])
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1], strict=True))


def test_uplink_counts_are_checked_at_their_bounds():
    algorithm, _ = make_ferret(tiny_params())  # K = 4
    blocks = len(algorithm.blocks)

    def uplink(counts, coords=None, n=1):
        counts = np.array(counts, np.uint16)
        coords = np.zeros(int(counts.sum()) if coords is None else coords, np.float32)
        return Message({"counts": counts, "coords": coords}, {"num_samples": n})

    assert algorithm.check_uplink_meta(uplink([4] + [0] * (blocks - 1))) is None  # K and 0 are allowed
    assert algorithm.check_uplink_meta(uplink([5] + [2] * (blocks - 1))) == "basis counts must lie in [0, 4]"
    assert algorithm.check_uplink_meta(uplink([2] * blocks, coords=2 * blocks + 1)) == (
        f"{2 * blocks + 1} coordinates for {2 * blocks} announced slots"
    )
    assert "num_samples" in algorithm.check_uplink_meta(uplink([2] * blocks, n=0))
    ctx = ClientContext(0, 1, None, None, 10, algorithm.streams, None, None)
    assert algorithm.client_begin(ctx).uplink is None  # nothing arrived: silent


def test_grouping_ties_stay_in_one_block_and_each_block_starts_its_count_at_zero():
    # median 100 -> target 90: 50 + 40 = 90 is not past it (one block), 90 + 100 is; a run of
    # small tensors (30 + 30 + 30) fills a block to the target, and the next one (20) opens another
    sizes = {"a": 50, "b": 40, "c": 100, "d": 30, "e": 30, "f": 30, "g": 20}
    sizes |= {name: 100 for name in "hijklmn"}
    blocks = group_blocks({name: torch.zeros(n) for name, n in sizes.items()})
    assert [b.names for b in blocks] == [("a", "b"), ("c",), ("d", "e", "f"), ("g",)] + [
        (n,) for n in "hijklmn"
    ]
    assert [b.size for b in blocks] == [90, 100, 90, 20] + [100] * 7


def test_allocation_below_unit_norms_and_another_minimum():
    assert allocate_bases([0.5, 0.25, 0.01], 16) == [16, 8, 2]  # only the ratio to the largest counts
    assert allocate_bases([1.0, 0.1], 8, minimum=3) == [8, 3]
    assert allocate_bases([], 8) == []


def test_round_cache_keeps_the_newest_rounds_within_its_cap():
    from taciturn.algorithms.replay import RoundCache

    def pieces(value):
        return [torch.full((4,), float(value))]  # 16 bytes a round

    cache = RoundCache(max_bytes=32)
    cache.put(1, pieces(1))
    cache.put(2, pieces(2))  # exactly at the cap: both stay
    assert cache.get(1)[0][0] == 1.0 and cache.get(2)[0][0] == 2.0 and cache.hits == 2
    cache.put(3, pieces(3))  # past the cap: the oldest round goes
    assert cache.get(1) is None and cache.get(2)[0][0] == 2.0 and cache.get(3)[0][0] == 3.0
    assert cache.hits == 4
    nothing = RoundCache(max_bytes=0)
    nothing.put(1, pieces(1))
    assert nothing.get(1) is None and nothing.hits == 0


def test_reconstruction_skips_only_the_empty_blocks_of_a_contribution():
    """Two contributions on blocks of 3 and 2: one with no slot for block 0, one with a single slot
    for block 1. Each block is the sum of gamma v over the slots it has, by hand from the bases."""
    blocks = [Block(("a",), ((3,),)), Block(("b",), ((2,),))]
    bases = Bases(Streams(9), "uniform")
    first = Contribution(0, [0, 2], torch.tensor([1.0, -2.0]))
    second = Contribution(1, [2, 1], torch.tensor([0.5, 3.0, 4.0]))
    pieces = bases.reconstruct(blocks, [first, second], 7)

    def v(owner, block, slot, size):
        return bases.basis(7, owner, block, slot, size)

    block_a = 0.5 * v(1, 0, 0, 3) + 3.0 * v(1, 0, 1, 3)
    block_b = 1.0 * v(0, 1, 0, 2) - 2.0 * v(0, 1, 1, 2) + 4.0 * v(1, 1, 0, 2)
    torch.testing.assert_close(pieces[0], block_a)
    torch.testing.assert_close(pieces[1], block_b)


def test_a_block_longer_than_one_chunk_is_projected_and_rebuilt_from_the_whole_basis():
    from taciturn.algorithms.shared_bases import CHUNK

    d = CHUNK + 4464  # two chunks, the second a partial one
    blocks = one_block(d)
    bases = Bases(Streams(2), "uniform")
    delta = {"w": torch.randn(d, generator=torch.Generator().manual_seed(3))}
    coords = bases.project(delta, blocks, [2], 1, SERVER)
    v = [bases.basis(1, SERVER, 0, k, d).double() for k in range(2)]
    rho = 1 / (3 * d)  # uniform on [-1/sqrt(d), 1/sqrt(d)]
    expected = [float(v[k] @ delta["w"].double()) / (rho * 2) for k in range(2)]
    torch.testing.assert_close(
        coords.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-4, atol=0
    )
    (piece,) = bases.reconstruct(blocks, [Contribution(SERVER, [2], coords)], 1)
    by_hand = float(coords[0]) * v[0] + float(coords[1]) * v[1]
    torch.testing.assert_close(piece.double(), by_hand, rtol=1e-4, atol=1e-4 * float(by_hand.abs().max()))


def test_the_history_travels_in_compact_dtypes_from_each_clients_round_and_the_cache_cap_is_in_mib():
    algorithm, state = make_ferret(tiny_params(), replay_cache_mib=3)
    assert algorithm.cache.max_bytes == 3 * 2**20
    sent = []
    for round in (1, 2):  # client 0 speaks in both rounds; client 1 never
        out, _ = client_update(algorithm, state, round, 0, round)
        sent.append(out.uplink)
        state = algorithm.aggregate(state, round, [Arrival(0, out.uplink)])
    assert state.synced.tolist() == [1, 0, 0, 0] and state.synced.dtype == torch.int64
    down = algorithm.downlink(state, 3, [0, 1, 2])
    assert down[1] is down[2] and down[0] is not down[1]
    whole, tail = down[1], down[0]
    assert (whole.meta["first_round"], tail.meta["first_round"]) == (1, 2)
    dtypes = {name: array.dtype for name, array in whole.arrays.items()}
    assert dtypes == {
        "rounds": np.dtype(np.uint32),
        "owners": np.dtype(np.int32),
        "counts": np.dtype(np.uint16),
        "coords": np.dtype(np.float32),
    }
    assert whole.arrays["rounds"].tolist() == [1, 2] and whole.arrays["owners"].tolist() == [SERVER, SERVER]
    assert tail.arrays["rounds"].tolist() == [2] and tail.arrays["owners"].tolist() == [SERVER]
    # one client a round: its counts, and its coordinates divided by the one client heard from
    assert whole.arrays["counts"].tolist() == [u.arrays["counts"].tolist() for u in sent]
    assert np.array_equal(whole.arrays["coords"], np.concatenate([u.arrays["coords"] for u in sent]))
    assert tail.arrays["counts"].tolist() == [sent[1].arrays["counts"].tolist()]
    assert np.array_equal(tail.arrays["coords"], sent[1].arrays["coords"])
    history = (state.history_rounds, state.history_owners, state.history_counts, state.history_coords)
    assert [t.dtype for t in history] == [torch.int64, torch.int64, torch.int32, torch.float32]
    ctx = ClientContext(1, 3, whole, None, 10, algorithm.streams, None, None)
    work = algorithm.client_begin(ctx)  # client 1 replays rounds 1 and 2 onto w_0
    assert work.consts == {} and all(torch.equal(work.params[k], state.params[k]) for k in state.params)


def test_a_ferret_client_needs_the_servers_start_and_a_copy_that_matches_the_history():
    params = tiny_params()
    fresh = Ferret(FerretConfig())
    fresh.use_streams(Streams(0))
    history = Message({}, {"first_round": 1})
    with pytest.raises(AssertionError) as refused:
        fresh.client_begin(ClientContext(0, 1, history, None, 10, fresh.streams, None, None))
    assert str(refused.value) == "init_server runs before any client"
    algorithm, state = make_ferret(params)
    down = algorithm.downlink(state, 1, [2])[2]
    ahead = {"synced_round": torch.tensor(1), **{f"params/{k}": v for k, v in params.items()}}
    with pytest.raises(
        ValueError, match=r"^client 2 holds the model of round 1, but round 1 starts from round 0"
    ):
        algorithm.client_begin(ClientContext(2, 1, down, ahead, 10, algorithm.streams, None, None))


def test_pieces_are_added_tensor_by_tensor_along_a_block_of_three():
    params = {"a": torch.zeros(1), "b": torch.zeros(2), "c": torch.zeros(1, 3), "d": torch.ones(2)}
    blocks = [Block(("a", "b", "c"), ((1,), (2,), (1, 3))), Block(("d",), ((2,),))]
    apply_pieces(params, blocks, [torch.arange(6.0), torch.tensor([1.0, -1.0])], -2.0)
    assert params["a"].tolist() == [0.0] and params["b"].tolist() == [-2.0, -4.0]
    assert params["c"].tolist() == [[-6.0, -8.0, -10.0]] and params["d"].tolist() == [-1.0, 3.0]


def test_a_uniform_basis_is_torchs_uniform_draw_from_its_slots_seed_chunk_by_chunk():
    from taciturn.algorithms.shared_bases import CHUNK

    d = CHUNK + 10
    v = Bases(Streams(7), "uniform").basis(3, SERVER, 2, 4, d)
    seed = Streams(7).seeds_for(3, SERVER, "ferret-basis/2", 5)[4]  # slot 4 of (round 3, server, block 2)
    generator, c = torch.Generator().manual_seed(seed), 1 / math.sqrt(d)
    chunks = [torch.empty(n).uniform_(-c, c, generator=generator) for n in (CHUNK, 10)]
    assert torch.equal(v, torch.cat(chunks))


def test_a_truncated_normal_basis_is_the_inverse_cdf_of_its_slots_uniform_draw():
    """v = sqrt(2) erfinv(u), u uniform on (-erf(c / sqrt 2), erf(c / sqrt 2)): N(0, 1) cut to [-c, c]."""
    from scipy.special import erfinv

    d = 3  # c = 1/sqrt(3): wide enough that the truncated normal is far from uniform
    v = Bases(Streams(7), "truncated_normal").basis(2, SERVER, 1, 0, d)
    seed = Streams(7).seeds_for(2, SERVER, "ferret-basis/1", 1)[0]
    c = 1 / math.sqrt(d)
    edge = math.erf(c / math.sqrt(2))
    u = torch.empty(d).uniform_(-edge, edge, generator=torch.Generator().manual_seed(seed))
    expected = math.sqrt(2) * erfinv(u.double().numpy())
    np.testing.assert_allclose(v.double().numpy(), expected, rtol=1e-6, atol=0)
    assert float(v.abs().max()) <= c and len(set(v.tolist())) == d


def test_uniform_coordinates_are_scaled_by_exactly_3d_over_k():
    """rho = c^2 / 3 = 1 / (3 d) for uniform bases: gamma_k = 3 d v_k . Delta / K (d = 3, K = 2)."""
    delta = {"w": torch.tensor([1.0, -2.0, 0.5])}
    bases = Bases(Streams(8), "uniform")
    coords = bases.project(delta, one_block(3), [2], 4, SERVER)
    v = [bases.basis(4, SERVER, 0, k, 3).double() for k in range(2)]
    expected = [3 * 3 * float(v[k] @ delta["w"].double()) / 2 for k in range(2)]
    np.testing.assert_allclose(coords.double().numpy(), expected, rtol=1e-6)
