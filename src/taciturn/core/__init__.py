"""The vocabulary every other layer speaks: messages, bytes, channels, randomness, client state."""

from taciturn.core.channel import Channel, Direction
from taciturn.core.codec import decode, encode
from taciturn.core.ledger import Ledger
from taciturn.core.message import Message
from taciturn.core.rng import SERVER, Streams
from taciturn.core.state_store import ClientStateStore, MemoryStateStore

__all__ = [
    "SERVER",
    "Channel",
    "ClientStateStore",
    "Direction",
    "Ledger",
    "MemoryStateStore",
    "Message",
    "Streams",
    "decode",
    "encode",
]
