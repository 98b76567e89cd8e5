"""taciturn messages inside Flower messages, and what they cost on the wire.

Every Flower message of a deployed run carries one ConfigRecord named ``taciturn``. The server
sends one message a node a round, for all of the node's picked clients at once (a SuperNode serves
one message at a time, so a message per client would queue them):

    query request     (server -> node):  version
    query reply       (node -> server):  version, clients (the ids it hosts), sizes (their n_k);
                                         with per-client data also test_sizes and schema
    train request     (server -> node):  version, round, population, clients, accepted, kept, payloads
    train reply       (node -> server):  round, clients, payloads, errors
    evaluate request  (server -> node):  version, population, payload (the global model)
    evaluate reply    (node -> server):  clients, samples, metrics (names), values

``payloads[i]`` is the codec's safetensors encoding of client ``clients[i]``'s taciturn Message
(core/codec.py), or empty bytes for "no model": a downlink the algorithm left silent (event-based
ADMM's unchanged z) or a silent uplink (an event trigger that did not fire); ``errors[i]`` is why
client ``clients[i]`` failed on the node ("" when it did not). Flower carries bytes in a
ConfigRecord as they are, so nothing on the wire is pickled and each payload is byte for byte what
the simulation counts. ``accepted[i]`` is the last round whose reply from the client the server
took (0: none), the acknowledgement that names the client state in effect on the node; ``kept[i]``
is the same at the server's last checkpoint (node_state.py; DESIGN.md, "Acceptance").
``version`` is the sender's taciturn version: the node refuses a server of another version, the
server a node of another (deploy/settings.py ``same_version``). ``population``: the run-wide numbers
a client needs and a node holding only its own data cannot know (experiments/clients.py; empty
when every node reads the run's whole dataset).

Wire size: Flower 1.42 sends a message as a tree of objects (the Message with its metadata, its
RecordDict, each record), each serialized on its own (``deflate``); the sum of their sizes is what
crosses the network above gRPC/HTTP2/TLS framing. ``shares`` splits one message's size over the
clients it carries: each its payload and an equal part of the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

from taciturn.core.codec import CodecError, decode, encode
from taciturn.core.message import Message as TaciturnMessage
from taciturn.data.clients import Schema

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
EVALUATE = "evaluate"


def payload_of(message: TaciturnMessage | None) -> bytes:
    return b"" if message is None else encode(message)


def message_of(payload: bytes) -> TaciturnMessage | None:
    return None if not payload else decode(payload)


@dataclass(frozen=True)
class TrainRequest:
    """One round's work for one node: each of its picked clients with its downlink payload."""

    version: str
    round: int
    population: tuple[int, ...]
    clients: tuple[int, ...]
    accepted: tuple[int, ...]
    kept: tuple[int, ...]
    payloads: tuple[bytes, ...]

    def fields(self) -> dict:
        return {
            "version": self.version,
            "round": self.round,
            "population": list(self.population),
            "clients": list(self.clients),
            "accepted": list(self.accepted),
            "kept": list(self.kept),
            "payloads": list(self.payloads),
        }

    def content(self) -> RecordDict:
        return RecordDict({RECORD: ConfigRecord(self.fields())})


@dataclass(frozen=True)
class TrainReply:
    round: int
    clients: tuple[int, ...]
    payloads: tuple[bytes, ...]
    errors: tuple[str, ...]


def read_request(content: RecordDict, name: str = RECORD) -> TrainRequest:
    """The train request in ``content``'s ConfigRecord ``name`` (FIT_CONFIG under SecAgg+)."""
    record = _record(content, name)
    clients = _ints(record, "clients")
    lists = [_ints(record, "accepted"), _ints(record, "kept"), _list(record, "payloads", bytes)]
    if any(len(values) != len(clients) for values in lists):
        raise CodecError("a train request names each client once in clients, accepted, kept and payloads")
    return TrainRequest(
        _str(record, "version"), _int(record, "round"), _ints(record, "population"), clients, *lists
    )


def train_reply(round: int, clients: list[int], payloads: list[bytes], errors: list[str]) -> RecordDict:
    fields = {"round": round, "clients": clients, "payloads": payloads, "errors": errors}
    return RecordDict({RECORD: ConfigRecord(fields)})


def read_reply(content: RecordDict) -> TrainReply:
    record = _record(content)
    clients, payloads, errors = (
        _ints(record, "clients"),
        _list(record, "payloads", bytes),
        _list(record, "errors", str),
    )
    if not len(clients) == len(payloads) == len(errors):
        raise CodecError("a train reply names each client once in clients, payloads and errors")
    return TrainReply(_int(record, "round"), clients, payloads, errors)


def version_request(version: str) -> RecordDict:
    return RecordDict({RECORD: ConfigRecord({"version": version})})


def read_version(content: RecordDict, name: str = RECORD) -> str:
    return _str(_record(content, name), "version")


@dataclass(frozen=True)
class Hosted:
    """A node's answer to the server's query: what it runs and which clients it hosts."""

    version: str
    sizes: dict[int, int]  # client -> training samples
    test_sizes: dict[int, int] | None = None  # per-client data: client -> held-out samples
    schema: Schema | None = None  # per-client data: the shapes and classes of the node's data


def query_reply(hosted: Hosted) -> RecordDict:
    fields = {"version": hosted.version, "clients": list(hosted.sizes), "sizes": list(hosted.sizes.values())}
    if hosted.test_sizes is not None and hosted.schema is not None:
        tests = [hosted.test_sizes[c] for c in hosted.sizes]
        fields |= {"test_sizes": tests, "schema": hosted.schema.fields()}
    return RecordDict({RECORD: ConfigRecord(fields)})


def read_query_reply(content: RecordDict) -> Hosted:
    record = _record(content)
    clients, sizes = _ints(record, "clients", minimum=0), _ints(record, "sizes", minimum=0)
    if len(clients) != len(sizes):
        raise CodecError(f"a query reply names {len(clients)} clients and {len(sizes)} sizes")
    hosted = Hosted(_str(record, "version"), dict(zip(clients, sizes, strict=True)))
    if "schema" not in record:
        return hosted
    tests = _ints(record, "test_sizes", minimum=0)
    if len(tests) != len(clients):
        raise CodecError(f"a query reply names {len(clients)} clients and {len(tests)} held-out sizes")
    try:
        schema = Schema.from_fields(_ints(record, "schema", minimum=0))
    except (IndexError, ValueError) as error:
        raise CodecError(f"a query reply's schema is malformed: {error}") from None
    return Hosted(hosted.version, hosted.sizes, dict(zip(clients, tests, strict=True)), schema)


def evaluate_request(version: str, population: list[int], payload: bytes) -> RecordDict:
    fields = {"version": version, "population": population, "payload": payload}
    return RecordDict({RECORD: ConfigRecord(fields)})


@dataclass(frozen=True)
class EvaluateRequest:
    version: str
    population: tuple[int, ...]
    payload: bytes


def read_evaluate_request(content: RecordDict) -> EvaluateRequest:
    record = _record(content)
    return EvaluateRequest(_str(record, "version"), _ints(record, "population"), _bytes(record, "payload"))


def evaluate_reply(scores: list[tuple[int, int, dict[str, float]]]) -> RecordDict:
    """Each of the node's clients with a held-out split: (client, samples, metrics)."""
    names = list(scores[0][2]) if scores else []
    fields = {
        "clients": [c for c, _, _ in scores],
        "samples": [n for _, n, _ in scores],
        "metrics": names,
        "values": [float(m[name]) for _, _, m in scores for name in names],
    }
    return RecordDict({RECORD: ConfigRecord(fields)})


def read_evaluate_reply(content: RecordDict) -> list[tuple[int, int, dict[str, float]]]:
    record = _record(content)
    clients, samples = _ints(record, "clients", minimum=0), _ints(record, "samples", minimum=1)
    names, values = _list(record, "metrics", str), _list(record, "values", float)
    if len(clients) != len(samples) or len(values) != len(clients) * len(names):
        raise CodecError("an evaluate reply names each client once, with one value per metric")
    k = len(names)
    return [
        (c, n, dict(zip(names, values[i * k : (i + 1) * k], strict=True)))
        for i, (c, n) in enumerate(zip(clients, samples, strict=True))
    ]


def wire_size(message: Message) -> int:
    """Bytes of the serialized Flower message: every object of its tree, as Flower sends them."""
    return sum(len(obj.deflate()) for obj in get_all_nested_objects(message).values())


def shares(total: int, payloads: list[int]) -> list[int]:
    """``total`` wire bytes of one message split over the clients it carries: each its payload
    and an equal part of the framing (the first clients take the remainder), summing to ``total``."""
    frame, count = total - sum(payloads), len(payloads)
    part, extra = divmod(frame, count)
    return [p + part + (i < extra) for i, p in enumerate(payloads)]


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


def _str(record: ConfigRecord, key: str) -> str:
    value = record.get(key)
    if not isinstance(value, str):
        raise CodecError(f"record field {key!r} must be a string, got {type(value).__name__}")
    return value


def _bytes(record: ConfigRecord, key: str) -> bytes:
    value = record.get(key)
    if not isinstance(value, bytes):
        raise CodecError(f"record field {key!r} must be bytes, got {type(value).__name__}")
    return value


def _list(record: ConfigRecord, key: str, kind: type) -> tuple:
    values = record.get(key)
    accepted = (float, int) if kind is float else kind  # a float list may hold whole numbers
    if not isinstance(values, list) or not all(
        isinstance(v, accepted) and not isinstance(v, bool) for v in values
    ):
        raise CodecError(f"record field {key!r} must be a list of {kind.__name__}, got {values!r:.80}")
    return tuple(values)


def _ints(record: ConfigRecord, key: str, minimum: int | None = None) -> tuple[int, ...]:
    values = _list(record, key, int)
    if minimum is not None and any(v < minimum for v in values):
        raise CodecError(f"record field {key!r} must hold integers >= {minimum}, got {list(values)!r:.80}")
    return values
