import numpy as np
import pytest
import torch

from taciturn.core import Channel, Direction, Ledger, MemoryStateStore, Message, Streams, encode
from taciturn.core.rng import SERVER


def msg(value=1.0):
    return Message({"w": np.full(10, value, np.float32)}, {"n": 3})


def test_dropped_message_is_counted_as_sent_not_delivered():
    ledger = Ledger()
    channel = Channel(ledger, Streams(0), drop_up=1.0)
    assert channel.send(Direction.UP, 1, 4, msg()) is None
    totals = ledger.totals(Direction.UP)
    size = len(encode(msg()))
    assert (totals.messages_sent, totals.messages_delivered, totals.bytes_sent, totals.bytes_delivered) == (
        1,
        0,
        size,
        0,
    )
    assert ledger.rows() == [
        {
            "round": 1,
            "client": 4,
            "direction": "up",
            "messages_sent": 1,
            "messages_delivered": 0,
            "bytes_sent": size,
            "bytes_delivered": 0,
        }
    ]


def test_delivered_message_is_a_decoded_copy():
    channel = Channel(Ledger(), Streams(0))
    sent = msg()
    got = channel.send(Direction.DOWN, 1, 0, sent)
    got.arrays["w"][0] = 99.0
    assert sent.arrays["w"][0] == 1.0  # the receiver cannot alias the sender's memory


def test_drop_rate_and_directions_are_independent():
    ledger = Ledger()
    channel = Channel(ledger, Streams(7), drop_up=0.3, drop_down=0.0)
    for r in range(1, 201):
        for c in range(10):
            channel.send(Direction.UP, r, c, msg())
            channel.send(Direction.DOWN, r, c, msg())
    up, down = ledger.totals(Direction.UP), ledger.totals(Direction.DOWN)
    assert down.messages_delivered == down.messages_sent == 2000
    # 2000 Bernoulli(0.7) deliveries: mean 1400, sd ~20.5; 5 sd bounds
    assert abs(up.messages_delivered - 1400) < 103


def test_drops_are_reproducible_from_the_seed():
    def pattern(seed):
        channel = Channel(Ledger(), Streams(seed), drop_up=0.5)
        return [channel.send(Direction.UP, r, c, msg()) is None for r in range(1, 6) for c in range(8)]

    assert pattern(1) == pattern(1)
    assert pattern(1) != pattern(2)


def test_invalid_drop_probability():
    with pytest.raises(ValueError, match="drop_up"):
        Channel(Ledger(), Streams(0), drop_up=1.5)


def test_ledger_csv_round_trip(tmp_path):
    ledger = Ledger()
    channel = Channel(ledger, Streams(0), drop_up=0.5)
    for r in (1, 2, 3):
        for c in range(5):
            channel.send(Direction.DOWN, r, c, msg())
            channel.send(Direction.UP, r, c, msg(r))
        assert ledger.round_totals(r, Direction.DOWN).messages_sent == 5
        ledger.append_csv(tmp_path / "ledger.csv", r)
    rebuilt = Ledger.from_csv(tmp_path / "ledger.csv")
    for d in Direction:
        assert rebuilt.totals(d) == ledger.totals(d)
    upto2 = Ledger.from_csv(tmp_path / "ledger.csv", up_to_round=2)
    assert upto2.totals(Direction.DOWN).messages_sent == 10


def test_streams_are_keyed_by_round_client_purpose():
    s = Streams(42)
    a = s.numpy(3, 5, "batches").random(4)
    np.testing.assert_array_equal(a, Streams(42).numpy(3, 5, "batches").random(4))
    for other in (
        s.numpy(4, 5, "batches"),
        s.numpy(3, 6, "batches"),
        s.numpy(3, 5, "drop-up"),
        s.numpy(3, SERVER, "batches"),
        Streams(43).numpy(3, 5, "batches"),
    ):
        assert not np.array_equal(a, other.random(4))
    t1 = torch.randn(3, generator=s.torch(1, 2, "basis"))
    t2 = torch.randn(3, generator=Streams(42).torch(1, 2, "basis"))
    assert torch.equal(t1, t2)
    with pytest.raises(ValueError):
        s.numpy(-1, 0, "x")


def test_memory_store_checkpoint_round_trip(tmp_path):
    store = MemoryStateStore()
    store.put(3, {"c/w": torch.arange(6.0).reshape(2, 3), "count": torch.tensor(4)})
    store.put(10, {"c/w": torch.ones(2, 3)})
    store.save(tmp_path / "clients.safetensors")
    back = MemoryStateStore()
    back.load(tmp_path / "clients.safetensors")
    assert list(back.clients()) == [3, 10]
    assert torch.equal(back.get(3)["c/w"], torch.arange(6.0).reshape(2, 3))
    assert int(back.get(3)["count"]) == 4
    assert back.get(5) is None
