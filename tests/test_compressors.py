"""The compressors (compression/compressors.py) and their chains: exact encodings worked by hand,
unbiasedness and variance bounds computed exactly over every outcome of small cases (the test picks
the uniforms the compressor draws), a many-sample check on a larger one, and the receiver's checks."""

import itertools
import math

import numpy as np
import pytest
import torch

from taciturn.compression.chain import ArrayChain, Compress, CompressionError
from taciturn.compression.compressors import QSGD, Bf16, BlockQuant, Fp16, RandK, TopK, kept
from taciturn.core import Message, Streams

EPS = 1e-15  # a uniform just below 1: never under a rounding probability


class Uniforms:
    """Stands in for a generator: ``random`` returns the uniforms the test chose."""

    def __init__(self, values):
        self.values = np.asarray(values, np.float64)

    def random(self, n):
        assert n == self.values.size
        return self.values


def chosen(values):
    return lambda purpose: Uniforms(values)


def no_draws(purpose):
    raise AssertionError(f"a deterministic compressor drew {purpose!r}")


def stream_draws(seed=0, round=1):
    streams = Streams(seed)
    return lambda purpose: streams.numpy(round, 0, purpose)


def roundtrip(compressor, x, draw=no_draws):
    parts = compressor.encode(x, draw)
    layout = compressor.layout(x.size, x.dtype)
    assert {p: (a.shape, a.dtype) for p, a in parts.items()} == layout  # the layout the receiver checks
    return parts, compressor.decode(parts, x.size, x.dtype, draw)


def test_fp16_saturates_and_bf16_rounds_as_torch():
    x = np.array([1.0, 1 / 3, 70000.0, -1e-9, math.pi], np.float32)
    parts, back = roundtrip(Fp16(), x)
    assert parts["h"].dtype == np.float16
    assert back.tolist() == [1.0, float(np.float16(1 / 3)), 65504.0, 0.0, float(np.float16(math.pi))]
    parts, back = roundtrip(Bf16(), x)
    assert parts["b"][0] == 0x3F80  # 1.0 in bfloat16: float32's upper 16 bits
    assert np.array_equal(back, torch.tensor(x).bfloat16().float().numpy())


def test_int8_codes_and_per_block_absmax_scales_by_hand():
    x = np.array([1.0, -0.6, 0.25, 0.0, 2.0, -2.0])
    parts, back = roundtrip(BlockQuant(8, 4, "nearest"), x)
    # block 1: absmax 1, s = 1/127: q = rint(127, -76.2, 31.75, 0); block 2: s = 2/127
    assert parts["q"].tolist() == [127, -76, 32, 0, 127, -127]
    s = parts["s"].astype(np.float64)
    assert parts["s"].dtype == np.float32 and s[0] >= 1 / 127 and s[1] >= 2 / 127  # rounded up
    assert np.isclose(s, [1 / 127, 2 / 127], rtol=1e-7).all()
    assert np.array_equal(back, np.array([127, -76, 32, 0, 127, -127]) * np.repeat(s, 4)[:6])


def test_int8_error_is_at_most_half_a_scale_step():
    x = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    parts, back = roundtrip(BlockQuant(8, 64, "nearest"), x)
    step = np.repeat(parts["s"].astype(np.float64), 64)[:1000]
    assert (np.abs(back.astype(np.float64) - x) <= step / 2 * (1 + 1e-6)).all()


def test_int4_packs_two_codes_per_byte_low_nibble_first():
    parts, back = roundtrip(BlockQuant(4, 4, "nearest"), np.array([7.0, -7.0, 0.0, 3.5, 1.0]))
    # block 1: s = 7/7 = 1, q = (7, -7, 0, 4), stored q + 7 = (14, 0, 7, 11): bytes 14 + 0*16, 7 + 11*16
    # block 2: s = 1/7, q = 7, stored 14, alone in the last byte
    assert parts["q"].tolist() == [14, 183, 14]
    assert back[:4].tolist() == [7.0, -7.0, 0.0, 4.0] and back[4] == pytest.approx(1.0)


def outcomes(p, up, down):
    """Every (uniforms, probability) pair for independent coordinates that go up with probability p,
    where uniform ``up`` makes a coordinate go up (wherever p > 0) and ``down`` keeps it down."""
    for ups in itertools.product([True, False], repeat=len(p)):
        weight = math.prod(pi if u else 1 - pi for pi, u in zip(p, ups, strict=True))
        yield np.where(ups, up, down), weight


def test_stochastic_int8_is_unbiased_exactly_with_variance_below_a_quarter_step_squared():
    x = np.array([0.3, -0.71, 0.05, 1.0])
    quant = BlockQuant(8, 4, "stochastic")
    scale = float(quant.encode(x, chosen(np.zeros(4)))["s"][0])
    q = x / scale
    p = q - np.floor(q)  # the chance of rounding up
    mean, square = np.zeros(4), 0.0
    for uniforms, weight in outcomes(p, up=1 - EPS, down=0.0):  # floor(q + u) is up iff u >= 1 - p
        _, back = roundtrip(quant, x, chosen(uniforms))
        mean += weight * back
        square += weight * float(((back - x) ** 2).sum())
    np.testing.assert_allclose(mean, x, rtol=0, atol=1e-15)
    assert square == pytest.approx(float((scale**2 * p * (1 - p)).sum()), rel=1e-9)
    assert square <= 4 * scale**2 / 4


def test_qsgd_rounds_each_level_up_with_probability_r_minus_l_by_hand():
    # ||v|| = 1, s = 2: r = |v| s / ||v|| = (1.2, 1.6), l = (1, 1), up with probability (0.2, 0.6)
    parts, back = roundtrip(QSGD(levels=2, bucket=8), np.array([0.6, -0.8]), chosen([0.1, 0.7]))
    # levels (2, 1) with signs: (2, -1); 2s + 1 = 5 values need 4 bits: (2 + 2) + (-1 + 2) * 16 = 20
    assert parts["q"].tolist() == [20] and parts["n"].tolist() == [1.0]
    np.testing.assert_allclose(back, [1.0, -0.5])


@pytest.mark.parametrize("levels", [1, 3])
def test_qsgd_is_unbiased_and_within_lemma_3_1_exactly_over_every_outcome(levels):
    v = np.array([0.9, -0.2, 0.0, -1.7, 0.4])
    qsgd = QSGD(levels=levels, bucket=8)
    norm = float(qsgd.encode(v, chosen(np.zeros(5)))["n"][0])
    r = np.abs(v) / norm * levels
    p = r - np.floor(r)
    mean, square = np.zeros(5), 0.0
    for uniforms, weight in outcomes(p, up=0.0, down=1 - EPS):  # up iff u < r - l
        _, back = roundtrip(qsgd, v, chosen(uniforms))
        mean += weight * back
        square += weight * float(((back - v) ** 2).sum())
    np.testing.assert_allclose(mean, v, rtol=0, atol=1e-12)
    assert square == pytest.approx(float(((norm / levels) ** 2 * p * (1 - p)).sum()), rel=1e-9)
    bound = min(5 / levels**2, math.sqrt(5) / levels) * float(v @ v)  # Lemma 3.1 with d = 5
    assert qsgd.omega(5) == min(5 / levels**2, math.sqrt(5) / levels)
    assert square <= bound


def test_qsgd_with_buckets_many_samples_mean_and_variance_from_the_run_streams():
    d, samples = 256, 2000
    v = np.random.default_rng(1).normal(size=d)
    qsgd, streams = QSGD(levels=4, bucket=64), Streams(7)
    draws = [qsgd.encode(v, lambda p, i=i: streams.numpy(i, 0, p)) for i in range(samples)]
    backs = np.stack([qsgd.decode(parts, d, v.dtype, no_draws) for parts in draws])
    bound = qsgd.omega(d) * float(v @ v)  # per bucket b = 64: min(64/16, 8/4) = 2
    assert qsgd.omega(d) == 2.0
    errors = ((backs - v) ** 2).sum(axis=1)
    assert errors.mean() <= bound
    # the mean of n independent draws: E||mean - v||^2 = E||Q - v||^2 / n
    assert float(((backs.mean(axis=0) - v) ** 2).sum()) <= 2 * errors.mean() / samples


def test_topk_keeps_the_largest_and_breaks_ties_toward_the_lower_index():
    x = np.array([1.0, -3.0, 3.0, 0.5, 2.0])
    parts, back = roundtrip(TopK(0.4), x)
    assert parts["i"].tolist() == [1, 2] and parts["v"].tolist() == [-3.0, 3.0]
    parts, back = roundtrip(TopK(0.6), x)
    assert parts["i"].tolist() == [1, 2, 4] and back.tolist() == [0.0, -3.0, 3.0, 0.0, 2.0]
    assert float(((back - x) ** 2).sum()) <= (1 - 3 / 5) * float(x @ x)  # contractive, delta = k/d
    assert parts["i"].dtype == np.uint16 and TopK(0.1).layout(70000, np.float32)["i"][1] == np.uint32
    assert (kept(0.01, 300), kept(0.01, 50), kept(1.0, 7)) == (3, 1, 7)


class Subset:
    def __init__(self, subset):
        self.subset = np.array(subset)

    def choice(self, n, k, replace):
        assert not replace and k == self.subset.size
        return self.subset


@pytest.mark.parametrize("unbiased", [True, False])
def test_randk_in_expectation_over_every_subset_exactly(unbiased):
    x, d, k = np.array([1.0, -2.0, 0.5, 4.0, -1.5]), 5, 2
    randk = RandK(0.4, unbiased)
    subsets = list(itertools.combinations(range(d), k))
    backs = np.stack([roundtrip(randk, x, lambda p, s=s: Subset(s))[1] for s in subsets])
    mean, square = backs.mean(axis=0), float(((backs - x) ** 2).sum(axis=1).mean())
    if unbiased:  # E C(x) = x, E||C(x) - x||^2 = (d/k - 1) ||x||^2
        np.testing.assert_allclose(mean, x, rtol=0, atol=1e-15)
        assert square == pytest.approx((d / k - 1) * float(x @ x))
    else:  # E C(x) = (k/d) x, E||C(x) - x||^2 = (1 - k/d) ||x||^2
        np.testing.assert_allclose(mean, k / d * x, rtol=0, atol=1e-15)
        assert square == pytest.approx((1 - k / d) * float(x @ x))


def test_randk_draws_every_subset_alike_and_the_receiver_regenerates_it():
    streams, randk = Streams(3), RandK(0.4, True)
    counts: dict[tuple, int] = {}
    for i in range(5000):
        subset = tuple(randk.indices(5, lambda p, i=i: streams.numpy(i, 0, p)))
        counts[subset] = counts.get(subset, 0) + 1
    assert len(counts) == 10
    sigma = math.sqrt(5000 * 0.1 * 0.9)
    assert all(abs(c - 500) <= 5 * sigma for c in counts.values())
    x = np.arange(1.0, 11.0)
    parts = randk.encode(x, lambda p: streams.numpy(9, 2, p))  # sender
    back = randk.decode(parts, 10, x.dtype, lambda p: streams.numpy(9, 2, p))  # receiver, same stream
    kept_at = np.flatnonzero(back)
    assert kept_at.size == 4 and np.array_equal(back[kept_at], x[kept_at] * 10 / 4)
    assert parts.keys() == {"v"}  # only the values travel


def test_a_chain_quantises_the_kept_values_and_must_start_with_the_sparsifier():
    chain = ArrayChain((TopK(0.5), BlockQuant(8, 2, "nearest")))
    x = np.array([0.1, -4.0, 2.2, 0.3])
    parts = chain.encode(x, no_draws)
    assert {p: a.dtype.name for p, a in parts.items()} == {"i": "uint16", "v#q": "int8", "v#s": "float32"}
    assert parts["i"].tolist() == [1, 2] and parts["v#q"].tolist() == [-127, 70]  # s = 4/127: 69.85
    np.testing.assert_allclose(
        chain.decode(parts, 4, x.dtype, no_draws), [0, -4.0, 70 * 4 / 127, 0], rtol=1e-6
    )
    with pytest.raises(ValueError, match="sparsifier followed by a quantiser"):
        ArrayChain((Fp16(), TopK(0.5)))
    with pytest.raises(ValueError, match="leaves no values"):
        ArrayChain((Fp16(), Bf16()))


SPEC = {"w": ((6,), np.dtype(np.float32))}


def topk_message(**changes):
    sent, _ = Compress(ArrayChain((TopK(0.5),))).encode(
        Message({"w": np.array([1, -5, 2, 0, 3, 0.5], np.float32)}, {"num_samples": 3}),
        {},
        lambda n: no_draws,
    )
    arrays, meta = dict(sent.arrays), dict(sent.meta)
    for key, value in changes.items():
        key = key.replace("__", "#")
        (meta if key.endswith("#") else arrays).pop(key, None)
        if value is not None:
            (meta if key.endswith("#") else arrays)[key] = value
    return Message(arrays, meta)


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({}, None),
        ({"w__i": np.array([1, 4, 9], np.uint16)}, "increasing and below 6"),
        ({"w__i": np.array([4, 1, 2], np.uint16)}, "increasing"),
        ({"w__i": np.array([1, 4, 2], np.uint32)}, "expected uint16"),
        ({"w__v": None}, "'w#v' is missing"),
        ({"w__x": np.zeros(2, np.uint8)}, "unexpected arrays"),
        ({"w": np.zeros(6, np.float32)}, "arrived uncompressed"),
        ({"w__": "float32:7"}, "described as float32[7], expected float32[6]"),
        ({"w__": "int64:6"}, "not a float array"),
        ({"w__": "float32:1000000000000"}, "not a float array"),
        ({"v__": "float32:6"}, "unexpected array 'v'"),
    ],
)
def test_the_receiver_checks_every_part_before_decoding(changes, why):
    compress = Compress(ArrayChain((TopK(0.5),)))
    message = topk_message(**changes)
    if why is None:
        back, _ = compress.decode(message, {}, lambda n: no_draws, SPEC)
        assert back.arrays["w"].tolist() == [0, -5, 2, 0, 3, 0] and back.meta == {"num_samples": 3}
        return
    with pytest.raises(CompressionError, match=why.replace("[", r"\[").replace("]", r"\]")):
        compress.decode(message, {}, lambda n: no_draws, SPEC)


def test_a_sparse_array_of_unknown_length_is_refused_before_any_allocation():
    compress = Compress(ArrayChain((TopK(0.5),)))
    message = topk_message(w__="float32:6")
    with pytest.raises(CompressionError, match="no fixed shape"):
        compress.decode(message, {}, lambda n: no_draws, {"w": ((None,), np.dtype(np.float32))})
    int8 = Compress(ArrayChain((BlockQuant(8, 4, "nearest"),)))  # its codes are as long as the array
    sent, _ = int8.encode(Message({"w": np.ones(5, np.float32)}), {}, lambda n: no_draws)
    back, _ = int8.decode(sent, {}, lambda n: no_draws, {"w": ((None,), np.dtype(np.float32))})
    np.testing.assert_allclose(back.arrays["w"], np.ones(5), rtol=2e-7)  # the scale rounds up
