"""Channel.multicast: one message to many receivers, each copy counted and dropped as with send."""

import numpy as np

from taciturn.core import Channel, Direction, Ledger, Message, Streams, encode


def test_multicast_counts_and_drops_every_copy_like_separate_sends():
    message = Message(arrays={"sample": np.arange(4.0)})
    size = len(encode(message))
    one_by_one = Channel(Ledger(), Streams(3), drop_down=0.4)
    expected = [c for c in range(20) if one_by_one.send(Direction.DOWN, 7, c, message) is not None]
    multicast = Channel(Ledger(), Streams(3), drop_down=0.4)
    reached, arrived = multicast.multicast(Direction.DOWN, 7, range(20), message)
    assert reached == expected and 0 < len(reached) < 20
    np.testing.assert_array_equal(arrived.arrays["sample"], message.arrays["sample"])
    totals = multicast.ledger.totals(Direction.DOWN)
    assert (totals.messages_sent, totals.bytes_sent) == (20, 20 * size)
    assert (totals.messages_delivered, totals.bytes_delivered) == (len(reached), len(reached) * size)
    assert multicast.multicast(Direction.DOWN, 8, [], message) == ([], None)
