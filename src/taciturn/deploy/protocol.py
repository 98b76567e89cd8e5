"""taciturn messages inside Flower messages, and what they cost on the wire.

Every Flower message of a deployed run carries one ConfigRecord named ``taciturn``:

    train request (server -> node):  round, client, accepted, kept, payload
    train reply   (node -> server):  round, client, payload
    query reply   (node -> server):  clients (the ids the node hosts), sizes (their n_k)

``payload`` is the codec's safetensors encoding of a taciturn Message (core/codec.py), or empty
bytes for "no model": a downlink the algorithm left silent (event-based ADMM's unchanged z) or a
silent uplink (an event trigger that did not fire). Flower carries bytes in a ConfigRecord as
they are, so nothing on the wire is pickled and the payload is byte for byte what the simulation
counts. ``accepted`` is the last round whose reply from this client the server took (an uplink it
applied, or an empty reply: the client stayed silent; 0: none), the acknowledgement that names the
client state in effect on the node; ``kept`` is the same at the server's last checkpoint, the state
a resumed server starts from (node_state.py; DESIGN.md, "Acceptance").

Wire size: Flower 1.42 sends a message as a tree of objects (the Message with its metadata, its
RecordDict, each record), each serialized on its own (``deflate``); the sum of their sizes is what
crosses the network above gRPC/HTTP2/TLS framing.
"""

from __future__ import annotations

from dataclasses import dataclass

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

from taciturn.core.codec import CodecError, decode, encode
from taciturn.core.message import Message as TaciturnMessage

# Error replies the SuperLink makes itself when the destination node is offline (it left, was
# killed, or missed its heartbeats) or the message expired: no node answered, so the client is
# dropped, as the simulated Channel drops a message.
GONE = frozenset(
    {ErrorCode.NODE_UNAVAILABLE, ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE}
)

RECORD = "taciturn"
FIT_CONFIG = "fitins.config"  # under SecAgg+ the request rides in the workflow's FitIns (secagg.py)
TRAIN = "train"
QUERY = "query"


def payload_of(message: TaciturnMessage | None) -> bytes:
    return b"" if message is None else encode(message)


def message_of(payload: bytes) -> TaciturnMessage | None:
    return None if not payload else decode(payload)


@dataclass(frozen=True)
class TrainRequest:
    round: int
    client: int
    accepted: int
    kept: int
    payload: bytes

    def fields(self) -> dict:
        return {
            "round": self.round,
            "client": self.client,
            "accepted": self.accepted,
            "kept": self.kept,
            "payload": self.payload,
        }

    def content(self) -> RecordDict:
        return RecordDict({RECORD: ConfigRecord(self.fields())})


@dataclass(frozen=True)
class TrainReply:
    round: int
    client: int
    payload: bytes


def read_request(content: RecordDict, name: str = RECORD) -> TrainRequest:
    """The train request in ``content``'s ConfigRecord ``name`` (FIT_CONFIG under SecAgg+)."""
    record = _record(content, name)
    return TrainRequest(
        *(_int(record, key) for key in ("round", "client", "accepted", "kept")), _bytes(record, "payload")
    )


def train_reply(round: int, client: int, payload: bytes) -> RecordDict:
    return RecordDict({RECORD: ConfigRecord({"round": round, "client": client, "payload": payload})})


def read_reply(content: RecordDict) -> TrainReply:
    record = _record(content)
    return TrainReply(_int(record, "round"), _int(record, "client"), _bytes(record, "payload"))


def query_reply(sizes: dict[int, int]) -> RecordDict:
    """The clients a node hosts and the number of training samples each has on it."""
    return RecordDict({RECORD: ConfigRecord({"clients": list(sizes), "sizes": list(sizes.values())})})


def read_query_reply(content: RecordDict) -> dict[int, int]:
    """client -> its number of training samples on the node."""
    record = _record(content)
    clients, sizes = record.get("clients"), record.get("sizes")
    for name, values in (("clients", clients), ("sizes", sizes)):
        if not isinstance(values, list) or not all(isinstance(v, int) and v >= 0 for v in values):
            raise CodecError(f"a query reply's {name} is a list of integers >= 0, got {values!r}")
    if len(clients) != len(sizes):
        raise CodecError(f"a query reply names {len(clients)} clients and {len(sizes)} sizes")
    return dict(zip(clients, sizes, strict=True))


def wire_size(message: Message) -> int:
    """Bytes of the serialized Flower message: every object of its tree, as Flower sends them."""
    return sum(len(obj.deflate()) for obj in get_all_nested_objects(message).values())


def _record(content: RecordDict, name: str = RECORD) -> ConfigRecord:
    record = content.config_records.get(name)
    if record is None:
        raise CodecError(f"a taciturn Flower message carries a ConfigRecord named {name!r}")
    return record


def _int(record: ConfigRecord, key: str) -> int:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CodecError(f"record field {key!r} must be an integer, got {value!r}")
    return value


def _bytes(record: ConfigRecord, key: str) -> bytes:
    value = record.get(key)
    if not isinstance(value, bytes):
        raise CodecError(f"record field {key!r} must be bytes, got {type(value).__name__}")
    return value
