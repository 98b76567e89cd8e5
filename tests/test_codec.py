import json
import struct

import numpy as np
import pytest
import safetensors.numpy
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from taciturn.core import Channel, Direction, Ledger, Message, Streams, decode, encode
from taciturn.core.codec import CodecError

DTYPES = [
    np.bool_,
    np.uint8,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
]

arrays = st.sampled_from(DTYPES).flatmap(
    lambda dt: hnp.arrays(dtype=dt, shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
)
names = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=12
).filter(lambda s: s != "__metadata__")
meta_values = st.one_of(
    st.text(max_size=20),
    st.integers(-(2**53), 2**53),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
)
messages = st.builds(
    Message,
    arrays=st.dictionaries(names, arrays, max_size=5),
    meta=st.dictionaries(st.text(max_size=10), meta_values, max_size=5),
)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@settings(max_examples=200, deadline=None)
@given(messages)
def test_round_trip_is_exact(message):
    back = decode(encode(message))
    assert set(back.arrays) == set(message.arrays)
    for name, array in message.arrays.items():
        assert same_bits(back.arrays[name], array)  # NaN payloads and -0.0 included
    assert dict(back.meta) == dict(message.meta)
    assert all(type(back.meta[k]) is type(v) for k, v in message.meta.items())


def test_round_trip_keeps_nan_and_noncontiguous_and_big_endian():
    a = np.array([np.nan, -0.0, np.inf, 1.5], dtype=np.float32)
    strided = np.arange(20, dtype=np.float64).reshape(4, 5)[:, ::2]
    big = np.arange(6, dtype=">i4")
    back = decode(encode(Message({"a": a, "s": strided, "b": big})))
    assert same_bits(back.arrays["a"], a)
    np.testing.assert_array_equal(back.arrays["s"], strided)
    np.testing.assert_array_equal(back.arrays["b"], big)


def test_decoded_arrays_come_in_name_order():
    """safetensors hands arrays back in hash order, which differs between processes."""
    names = ["z", "a.weight", "m", "a.bias", "b"]
    back = decode(encode(Message({n: np.zeros(3, np.float32) for n in names})))
    assert list(back.arrays) == sorted(names)


def test_a_broadcast_is_decoded_once_and_counted_for_every_client():
    ledger = Ledger()
    channel = Channel(ledger, Streams(0))
    broadcast = Message({"w": np.arange(4, dtype=np.float32)})
    received = [channel.send(Direction.DOWN, 1, client, broadcast) for client in range(3)]
    assert received[0] is received[1] is received[2]
    assert received[0] is not broadcast
    assert ledger.totals(Direction.DOWN).messages_sent == 3
    assert ledger.totals(Direction.DOWN).bytes_sent == 3 * len(encode(broadcast))
    other = Message({"w": np.ones(4, dtype=np.float32)})
    np.testing.assert_array_equal(channel.send(Direction.DOWN, 1, 0, other).arrays["w"], other.arrays["w"])


def test_encoding_is_plain_safetensors():
    message = Message({"w": np.ones((2, 3), np.float32)}, {"round": 3})
    loaded = safetensors.numpy.load(encode(message))
    np.testing.assert_array_equal(loaded["w"], np.ones((2, 3)))


@pytest.mark.parametrize(
    "data", [b"", b"\x01\x02", b"\xff" * 8 + b"{}", b"\x02\x00\x00\x00\x00\x00\x00\x00{x"]
)
def test_garbage_is_a_codec_error(data):
    with pytest.raises(CodecError):
        decode(data)


def test_unsupported_content_is_refused_with_a_reason():
    with pytest.raises(TypeError, match="no safetensors encoding"):
        encode(Message({"c": np.zeros(2, np.complex64)}))
    with pytest.raises(TypeError, match="metadata holds"):
        Message(meta={"x": [1, 2]})
    with pytest.raises(ValueError, match="finite"):
        Message(meta={"x": float("nan")})
    with pytest.raises(TypeError, match="from_tensors"):
        Message({"x": [1.0]})


@settings(max_examples=50, deadline=None)
@given(st.lists(messages, min_size=1, max_size=6))
def test_ledger_bytes_equal_encoded_sizes(batch):
    ledger = Ledger()
    channel = Channel(ledger, Streams(0))
    for client, message in enumerate(batch):
        channel.send(Direction.UP, 1, client, message)
    sizes = [len(encode(m)) for m in batch]
    assert ledger.totals(Direction.UP).bytes_sent == sum(sizes)
    assert [row["bytes_sent"] for row in ledger.rows()] == sizes
    assert ledger.totals(Direction.DOWN).bytes_sent == 0


def test_decode_errors_name_what_is_wrong_and_foreign_safetensors_have_empty_metadata():
    blob = encode(Message({"a": np.arange(3, dtype=">i4")}, {"k": 1}))
    decoded = decode(blob)
    assert decoded.arrays["a"].dtype == np.dtype("<i4") and decoded.arrays["a"].tolist() == [0, 1, 2]
    with pytest.raises(CodecError, match=r"^a message is at least 8 bytes \(the header length\), got 7$"):
        decode(blob[:7])
    (header,) = struct.unpack("<Q", blob[:8])
    with pytest.raises(
        CodecError, match=rf"^header length {header} exceeds the {header - 1} bytes that follow$"
    ):
        decode(blob[: 8 + header - 1])
    with pytest.raises(CodecError, match=r"^cannot decode message: "):
        decode(blob[:-1])  # a whole header, truncated data
    foreign = safetensors.numpy.save({"a": np.ones(2, np.float32)})  # no taciturn metadata at all
    assert decode(foreign).meta == {}
    listed = safetensors.numpy.save({"a": np.ones(2, np.float32)}, metadata={"taciturn": "[1]"})
    with pytest.raises(CodecError, match=r"^cannot decode message: "):  # metadata must be an object
        decode(listed)


def header_only(header: bytes, data: bytes = b"") -> bytes:
    """Hand-made safetensors bytes: the little-endian u64 header length, the header, the data."""
    return struct.pack("<Q", len(header)) + header + data


def test_each_malformed_header_gets_its_own_message():
    from taciturn.core.codec import MAX_HEADER_BYTES
    from taciturn.core.message import MAX_META_BYTES

    def refused(data, message):
        with pytest.raises(CodecError) as caught:
            decode(data)
        assert str(caught.value) == message

    refused("text", "a message is bytes, got str")
    refused(
        b"\x00" * 8,
        "cannot decode message: the header is not JSON (Expecting value: line 1 column 1 (char 0))",
    )
    huge = struct.pack("<Q", 2**63 + 5) + b"{}"  # read unsigned: far more than follows
    refused(huge, f"header length {2**63 + 5} exceeds the 2 bytes that follow")
    # the header cap: one byte over is refused before parsing; exactly at it, parsing starts
    refused(
        struct.pack("<Q", MAX_HEADER_BYTES + 1) + bytes(MAX_HEADER_BYTES + 1),
        (f"header of {MAX_HEADER_BYTES + 1} bytes is over the {MAX_HEADER_BYTES}-byte limit"),
    )
    with pytest.raises(CodecError, match="the header is not JSON"):
        decode(struct.pack("<Q", MAX_HEADER_BYTES) + bytes(MAX_HEADER_BYTES))
    refused(header_only(b"[]"), "cannot decode message: the header is not a JSON object")
    refused(header_only(b'{"__metadata__": "x"}'), "cannot decode message: __metadata__ must map to strings")
    refused(
        header_only(b'{"__metadata__": {"taciturn": 5}}'),
        ("cannot decode message: __metadata__ must map to strings"),
    )
    refused(
        header_only(b'{"x": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}}', b"\x00\x00"),
        (
            "array 'x' has dtype 'BF16'; a message holds only "
            "['BOOL', 'F16', 'F32', 'F64', 'I16', 'I32', 'I64', 'I8', 'U16', 'U32', 'U64', 'U8']"
        ),
    )
    # metadata: exactly the limit decodes, one character more is refused
    text = '{"a":"' + "x" * (MAX_META_BYTES - 8) + '"}'
    assert len(text) == MAX_META_BYTES
    at_limit = safetensors.numpy.save({}, metadata={"taciturn": text})
    assert decode(at_limit).meta == {"a": "x" * (MAX_META_BYTES - 8)}
    over = safetensors.numpy.save({}, metadata={"taciturn": text[:-2] + 'x"}'})
    refused(over, f"message metadata is {MAX_META_BYTES + 1} bytes, over the {MAX_META_BYTES}-byte limit")


def test_metadata_is_compact_json_with_sorted_keys_and_refusals_say_what_to_do():
    blob = encode(Message({"x": np.zeros(1, np.float32)}, {"b": 1, "a": 2}))
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + length])
    assert header["__metadata__"] == {"taciturn": '{"a":2,"b":1}'}  # the same meta gives the same bytes
    with pytest.raises(TypeError) as caught:
        encode(Message({"c": np.zeros(2, np.complex64)}))
    assert str(caught.value) == (
        "array 'c' has dtype complex64, which has no safetensors encoding; "
        "convert it to a bool, integer or float dtype"
    )
    from taciturn.core.message import MAX_META_BYTES

    at_limit = Message(meta={"a": "x" * (MAX_META_BYTES - 8)})  # '{"a":"' + x... + '"}': the limit exactly
    assert decode(encode(at_limit)).meta == at_limit.meta
    with pytest.raises(ValueError) as caught:
        encode(Message(meta={"a": "x" * (MAX_META_BYTES - 7)}))
    assert str(caught.value) == (
        f"message metadata is {MAX_META_BYTES + 1} bytes (limit {MAX_META_BYTES}); put data in arrays"
    )
