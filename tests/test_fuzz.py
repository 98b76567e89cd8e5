"""Fuzzing hostile input (hypothesis): codec bytes, configs, tamperings of every file of a run
directory followed by resume and report, the configs of every run type run to the end, the Python
API called with every kind of wrong argument, and user files among taciturn's under --overwrite.
Every case ends in a clean error (the layer's TaciturnError; exit code 2 from the CLI, one line, no
traceback) or in the right result: never another exception, never a silently accepted corruption,
never a lost file, never a file changed outside the run folder (a sandboxed home and neighbours).

`make test` runs these derandomised (conftest.py's profile); `make soak` runs them with many more
examples (TACITURN_FUZZ_SCALE).
"""

import json
import math
import shutil
import struct
import tomllib

import numpy as np
import pytest
import torch
from conftest import fuzz_examples, tiny_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import taciturn
from taciturn.cli import main
from taciturn.core.codec import CodecError, decode, encode
from taciturn.core.errors import TaciturnError
from taciturn.core.message import MAX_META_BYTES, Message
from taciturn.experiments import types
from taciturn.experiments.config import ConfigError, to_toml, validate
from taciturn.report.rundir import RunDir

pytestmark = pytest.mark.fuzz

VALID = encode(
    Message({"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array([1, 2], np.int64)}, {"r": 3})
)


def _decodes_cleanly(data: bytes) -> None:
    """decode gives a Message that re-encodes to itself, or a CodecError; nothing else."""
    try:
        message = decode(data)
    except CodecError:
        return
    again = decode(encode(message))
    assert list(again.arrays) == list(message.arrays) and again.meta == message.meta
    for name, array in message.arrays.items():
        assert again.arrays[name].tobytes() == array.tobytes()


# ----- codec -----
@settings(max_examples=fuzz_examples(300), deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_decode_or_fail_cleanly(data):
    _decodes_cleanly(data)


@settings(max_examples=fuzz_examples(300), deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(1, 255)), max_size=4),
    st.integers(0, len(VALID)),
)
def test_damaged_messages_decode_or_fail_cleanly(flips, cut):
    data = bytearray(VALID[:cut] if cut > 8 else VALID)
    for at, mask in flips:
        if at < len(data):
            data[at] ^= mask
    _decodes_cleanly(bytes(data))


def _with_header(header: dict, payload: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + payload


entries = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(["F32", "F64", "I64", "U8", "BOOL", "C64", "BF16", "F8_E4M3", "X", 5]),
        "shape": st.lists(
            st.one_of(st.integers(0, 4), st.integers(2**31, 2**62), st.integers(-3, -1)), max_size=3
        ),
        "data_offsets": st.lists(st.integers(0, 2**40), min_size=0, max_size=3),
    }
)


@settings(max_examples=fuzz_examples(300), deadline=None)
@given(st.dictionaries(st.text(max_size=5), entries, max_size=3), st.binary(max_size=64))
def test_hostile_headers_decode_or_fail_cleanly(header, payload):
    _decodes_cleanly(_with_header(header, payload))


def test_decode_refuses_what_encode_never_writes():
    c64 = _with_header({"c": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, bytes(8))
    with pytest.raises(CodecError, match="'C64'"):
        decode(c64)
    big_meta = {"__metadata__": {"taciturn": json.dumps({"x": "y" * (MAX_META_BYTES + 1)})}}
    with pytest.raises(CodecError, match="over the 65536-byte limit"):
        decode(_with_header(big_meta))
    huge = _with_header({"w": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 16]}}, bytes(16))
    with pytest.raises(CodecError):
        decode(huge)
    with pytest.raises(CodecError, match="not a JSON object"):
        decode(_with_header([1, 2]))  # type: ignore[arg-type]
    with pytest.raises(CodecError):
        decode(_with_header({"__metadata__": {"taciturn": "[1]"}}))


# ----- configs -----
KEYS = [
    ("name",),
    ("seed",),
    ("rounds",),
    ("data", "num_samples"),
    ("data", "separation"),
    ("partition", "num_clients"),
    ("partition", "alpha"),
    ("model", "kind"),
    ("algorithm", "fraction"),
    ("algorithm", "local", "lr"),
    ("algorithm", "local", "steps"),
    ("algorithm", "local", "weight_decay"),
    ("algorithm", "server_lr"),
    ("engine", "workers"),
    ("eval", "every"),
    ("checkpoint", "keep"),
    ("channel", "drop_up"),
]
values = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=12),
    st.text(alphabet=st.characters(codec="utf-8", categories=["Cc", "Cf", "Zs", "Po"]), max_size=6),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _tree() -> dict:
    return json.loads(json.dumps(tiny_config().model_dump(mode="json", exclude_none=True)))


@settings(max_examples=fuzz_examples(200), deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KEYS), values), min_size=1, max_size=3))
def test_configs_validate_or_fail_cleanly_and_round_trip(changes):
    tree = _tree()
    for key, value in changes:
        node = tree
        for part in key[:-1]:
            node = node.setdefault(part, {}) if isinstance(node.get(part), dict | None) else {}
        node[key[-1]] = value
    try:
        config = validate(tree, "<fuzz>")
    except ConfigError:
        return
    dumped = config.model_dump(mode="json")
    floats = [v for v in _leaves(dumped) if isinstance(v, float)]
    assert all(math.isfinite(v) for v in floats)
    assert not any(isinstance(v, bool) for k, v in _items(dumped) if k in {"rounds", "seed", "num_clients"})
    assert validate(tomllib.loads(to_toml(config)), "<again>") == config


def _leaves(tree):
    for _, value in _items(tree):
        yield value


def _items(tree):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _items(value)
        else:
            yield key, value


# ----- tampered run directories, then resume and report -----
@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz") / "run"
    types.start(tiny_config(), out, report=True, progress=False)
    return out


def _numbers(path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in RunDir(path).read_metrics()]


def _files(root) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


TAMPERS = ["flip", "truncate", "append", "delete", "garbage", "empty", "link"]


OUTSIDE = "outside.db"


def _tamper(path, how: str, at: float, outside=None) -> None:
    """Damage ``path``; "link" makes it a link to ``outside``, a file of the user's outside the run."""
    data = path.read_bytes()
    i = min(int(at * len(data)), max(len(data) - 1, 0))
    if how == "flip" and data:
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x20]) + data[i + 1 :])
    elif how == "truncate":
        path.write_bytes(data[:i])
    elif how == "append":
        path.write_bytes(data + b'\x00{"round": 9, "accuracy": "x"}\xff')
    elif how == "delete":
        path.unlink()
    elif how == "link":
        path.unlink()
        path.symlink_to(outside)
    elif how == "garbage":
        path.write_bytes(bytes(range(256)) * 3)
    else:
        path.write_bytes(b"")


@settings(
    max_examples=fuzz_examples(6),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    crashed=st.booleans(),
    pick=st.floats(0, 1, exclude_max=True),
    how=st.sampled_from(TAMPERS),
    at=st.floats(0, 1),
)
def test_a_tampered_run_resumes_right_or_fails_cleanly(
    finished, tmp_path_factory, capsys, crashed, pick, how, at
):
    run = tmp_path_factory.mktemp("tampered") / "run"
    shutil.copytree(finished, run)
    outside = run.parent / OUTSIDE
    outside.write_bytes(b"the user's own")
    if crashed:
        shutil.rmtree(RunDir(run).checkpoint_dir(6))
    files = [f for f in _files(run) if not f.startswith(".taciturn")]
    target = files[int(pick * len(files))]
    _tamper(run / target, how, at, outside)
    before = {f: (run / f).read_bytes() for f in _files(run)}
    capsys.readouterr()
    code = main(["resume", str(run), "--quiet"])
    err = capsys.readouterr().err
    assert code in (0, 2) and "Traceback" not in err, err
    if code == 0:  # accepted: then it is the uninterrupted run's result
        assert _numbers(run) == _numbers(finished), f"{target} ({how}) was silently accepted"
        assert main(["report", str(run)]) in (0, 2)
    else:  # refused: nothing recorded was cut or removed on the way to the error
        for name in ("metrics.jsonl", "ledger.csv", "config.toml", "partition.json"):
            if name in before:
                assert (run / name).read_bytes() == before[name], f"{name} changed by a refused resume"
    assert "Traceback" not in capsys.readouterr().err
    kept = {"config.toml", "metrics.jsonl", "ledger.csv", "partition.json", "run.json"}
    assert {f for f in before if f in kept} <= set(_files(run))  # no file lost
    assert outside.read_bytes() == b"the user's own"  # nothing written through a link


# ----- a 200,000-deep header, and the deployed server facing one (issue 40) -----
def _deep_header(depth: int = 200_000) -> bytes:
    text = b"[" * depth + b"]" * depth
    return struct.pack("<Q", len(text)) + text


def test_a_deeply_nested_header_is_a_codec_error_not_a_recursion_error():
    with pytest.raises(CodecError, match="nests too deeply"):
        decode(_deep_header())
    nested = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    with pytest.raises(CodecError):
        decode(struct.pack("<Q", len(nested)) + nested)


def test_the_deployed_server_takes_any_undecodable_reply_as_that_nodes_failure(tmp_path):
    """One node answering with bytes the codec cannot read (here a 200,000-deep header: once a
    RecursionError the server did not catch) loses its client's update, not the run."""
    pytest.importorskip("flwr")
    from taciturn.deploy import protocol
    from taciturn.deploy.inprocess import InProcessGrid
    from taciturn.deploy.server_app import run_deployed
    from taciturn.deploy.settings import ServerSettings

    class HostileNode(InProcessGrid):
        def push_messages(self, messages):
            ids = super().push_messages(messages)
            for reply in self.replies.values():
                record = reply.content.config_records.get(protocol.RECORD) if not reply.has_error() else None
                # a train reply (one per node) that carries client 3's update
                if record is not None and "payloads" in record and 3 in list(record["clients"]):
                    payloads = list(record["payloads"])
                    payloads[list(record["clients"]).index(3)] = _deep_header()
                    record["payloads"] = payloads
            return ids

    config = tiny_config(rounds=2, algorithm={"name": "fedavg", "fraction": 1.0})
    grid = HostileNode(config, [[0, 1, 2], [3, 4, 5], [6, 7]], tmp_path / "nodes")
    rundir = run_deployed(grid, ServerSettings(config, tmp_path / "run", False, 1.0))
    events = rundir.read_jsonl(rundir.events)
    rejected = [e for e in events if e["client"] == 3 and e["event"] == "rejected"]
    assert len(rejected) == 2 and all("nests too deeply" in e["reason"] for e in rejected)
    assert rundir.read_metrics()[-1]["round"] == 2


# ----- a sandbox: nothing outside the run folder may change -----
class Sandbox:
    """A home, a working directory and files outside any run (what links point at), all watched:
    every file anywhere in it except under runs/ (the run folders), the cache and the key folder."""

    def __init__(self, root, monkeypatch):
        self.root, self.runs = root, root / "cwd" / "runs"
        for sentinel in ("home/.bashrc", "home/.ssh/id_ed25519", "outside/x.db", "outside/Pictures/a.png"):
            (root / sentinel).parent.mkdir(parents=True, exist_ok=True)
            (root / sentinel).write_bytes(b"the user's own " + sentinel.encode())
        self.runs.mkdir(parents=True)
        monkeypatch.setenv("HOME", str(root / "home"))
        monkeypatch.setenv("XDG_CACHE_HOME", str(root / "cache"))
        monkeypatch.setenv("TACITURN_MAX_MEMORY_GIB", "0.25")  # what cannot fit is refused, fast
        monkeypatch.chdir(root / "cwd")
        self.count = 0
        self.before = self.snapshot()

    def snapshot(self) -> dict[str, bytes]:
        skip = (self.runs, self.root / "cache")
        return {
            str(p.relative_to(self.root)): p.read_bytes() if p.is_file() and not p.is_symlink() else b"<link>"
            for p in self.root.rglob("*")
            if not any(p == s or s in p.parents for s in skip) and not p.is_dir()
        }

    def out(self):
        self.count += 1
        return self.runs / f"r{self.count}"

    def check(self) -> None:
        """Nothing outside the run folders changed; then the runs go (the next example starts clean)."""
        assert self.snapshot() == self.before, "a file outside the run folder changed"
        shutil.rmtree(self.runs)
        self.runs.mkdir()


# ----- every run type's config, run (issue 40) -----
# Values that run: sizes mostly small, else large enough that only the bounds (memory, cores,
# classes) stand between them and the machine; durations (rounds, steps, episodes) small, so that an
# accepted config runs in a second; numbers in or near their range. Hostile types and signs are
# the validation fuzz's (below), which never runs what it accepts.
SMALL = st.integers(1, 12)
SIZE = st.one_of(SMALL, SMALL, SMALL, st.sampled_from([10**9, 10**12, 2**40, 2**62]))
SHORT = st.integers(1, 3)
ANY = st.one_of(st.floats(0.01, 1), st.floats(-1, 3), st.sampled_from([0, 1, 1e-30, 1e30]))

RUN_TYPES = {
    "federated": (
        {
            "name": "f",
            "rounds": 2,
            "data": {"dataset": "synthetic", "num_samples": 60, "num_features": 4, "num_classes": 3},
            "partition": {"kind": "dirichlet", "num_clients": 3, "alpha": 1.0, "min_size": 2},
            "model": {"kind": "mlp", "hidden": [4]},
            "algorithm": {"name": "fedavg", "fraction": 1.0, "local": {"steps": 2, "batch_size": 8}},
            "engine": {"executor": "sequential"},
            "checkpoint": {"every": 1},
        },
        {
            ("rounds",): SHORT,
            ("data", "num_samples"): SIZE,
            ("data", "num_features"): SIZE,
            ("data", "num_classes"): SIZE,
            ("data", "separation"): ANY,
            ("partition", "num_clients"): SIZE,
            ("partition", "alpha"): ANY,
            ("partition", "min_size"): SIZE,
            ("model", "hidden"): st.lists(SIZE, max_size=2),
            ("algorithm", "name"): st.sampled_from(["fedavg", "fedprox", "scaffold", "fedadmm"]),
            ("algorithm", "fraction"): ANY,
            ("algorithm", "local", "steps"): SHORT,
            ("algorithm", "local", "lr"): ANY,
            ("algorithm", "local", "batch_size"): SIZE,
            ("aggregation", "kind"): st.sampled_from(
                ["median", "krum", "centered_clip", "trimmed_mean", "x"]
            ),
            ("aggregation", "iterations"): SIZE,
            ("engine", "workers"): SIZE,
            ("engine", "threads"): SIZE,
            ("engine", "store"): st.sampled_from(["memory", "disk", "auto"]),
            ("eval", "batch_size"): SIZE,
            ("checkpoint", "keep"): SHORT,
            ("channel", "drop_up"): ANY,
        },
    ),
    "fedq": (
        {
            "type": "fedq",
            "name": "q",
            "agents": 2,
            "episodes": 20,
            "mdp": {"states": 2, "actions": 2, "horizon": 2},
        },
        {
            ("agents",): SIZE,
            ("episodes",): SHORT,
            ("mdp", "states"): SIZE,
            ("mdp", "actions"): SIZE,
            ("mdp", "horizon"): SHORT,
            ("algorithm", "bonus"): st.sampled_from(["hoeffding", "bernstein"]),
            ("algorithm", "c"): ANY,
            ("channel", "drop_down"): ANY,
            ("checkpoint", "every"): SHORT,
        },
    ),
    "bandits": (
        {
            "type": "bandits",
            "name": "b",
            "repetitions": 1,
            "horizon": 20,
            "record_every": 10,
            "methods": ["independent", "bass", "club"],
            "environment": {"num_agents": 3, "num_arms": 3, "dim": 2, "num_clusters": 1},
        },
        {
            ("repetitions",): SHORT,
            ("horizon",): SHORT,
            ("record_every",): SHORT,
            ("environment", "num_agents"): SIZE,
            ("environment", "num_arms"): SIZE,
            ("environment", "dim"): SIZE,
            ("environment", "num_clusters"): SIZE,
            ("environment", "noise"): ANY,
            ("linucb", "alpha"): ANY,
            ("methods",): st.lists(
                st.sampled_from(["bass", "oracle", "pooled", "dynucb", "sclub"]), max_size=3
            ),
        },
    ),
    "language": (
        {
            "name": "lm",
            "rounds": 1,
            "data": {"dataset": "instructions", "examples_per_task": 2, "heldout": 2, "test_examples": 2},
            "partition": {"kind": "iid", "num_clients": 2},
            "model": {
                "kind": "causal_lm",
                "hidden": 8,
                "layers": 1,
                "heads": 2,
                "max_length": 24,
                "max_new_tokens": 2,
            },
            "algorithm": {"name": "fedavg", "fraction": 1.0, "local": {"steps": 1, "batch_size": 2}},
            "eval": {"batch_size": 4},
            "engine": {"executor": "sequential"},
        },
        {
            ("rounds",): SHORT,
            ("data", "examples_per_task"): SIZE,
            ("data", "test_examples"): SHORT,
            ("data", "heldout"): SHORT,
            ("model", "hidden"): SIZE,
            ("model", "layers"): SIZE,
            ("model", "heads"): SIZE,
            ("model", "max_length"): SIZE,
            ("model", "architecture"): st.sampled_from(["llama", "gpt2"]),
            ("partition", "num_clients"): SIZE,
            ("algorithm", "name"): st.sampled_from(["fedavg", "ferret", "fedkseed"]),
        },
    ),
}


def _mutated(base: dict, changes) -> dict:
    tree = json.loads(json.dumps(base))
    for key, value in changes:
        node = tree
        for part in key[:-1]:
            node = node.setdefault(part, {}) if isinstance(node.get(part), dict | None) else {}
        node[key[-1]] = value
    return tree


def _changes(kind: str, hostile: bool = False):
    keys = {key: values for key in RUN_TYPES[kind][1]} if hostile else RUN_TYPES[kind][1]
    return st.lists(
        st.sampled_from(sorted(keys)).flatmap(lambda k: st.tuples(st.just(k), keys[k])),
        min_size=1,
        max_size=3,
    )


def _run_or_refuse(sandbox: Sandbox, tree: dict) -> None:
    """Validate and run ``tree``: a clean error of its layer or a finished run, nothing else."""
    try:
        config = types.validate_tree(tree, "<fuzz>")
        run = types.start(config, sandbox.out(), report=False, progress=False)
    except TaciturnError:
        return
    finally:
        sandbox.check()
    assert run is not None


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    return Sandbox(tmp_path / "sandbox", monkeypatch)


RUN_EXAMPLES = {"federated": 4, "fedq": 3, "bandits": 3, "language": 1}


@pytest.mark.parametrize("kind", sorted(RUN_TYPES))
def test_every_run_types_config_validates_or_fails_cleanly(kind):
    """Hostile values (types, signs, 2**70, NaN, control characters) in every run type's keys."""

    @settings(max_examples=fuzz_examples(50), deadline=None)
    @given(_changes(kind, hostile=True))
    def check(changes):
        tree = _mutated(RUN_TYPES[kind][0], changes)
        try:
            config = types.validate_tree(tree, "<fuzz>")
        except ConfigError:
            return
        assert types.validate_tree(tomllib.loads(to_toml(config)), "<again>") == config

    check()


@pytest.mark.parametrize("kind", sorted(RUN_TYPES))
def test_every_run_types_config_runs_or_fails_cleanly(sandbox, kind):
    @settings(max_examples=fuzz_examples(RUN_EXAMPLES[kind]), deadline=None)
    @given(_changes(kind))
    def check(changes):
        _run_or_refuse(sandbox, _mutated(RUN_TYPES[kind][0], changes))

    check()


# ----- the Python front door (issue 40) -----
class _Tuple(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x):
        return self.linear(x), x


class _Raises(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x):
        raise ValueError("<script>model</script>")


class _Long(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x):
        return self.linear(x).long()


def _meta():
    with torch.device("meta"):
        return nn.Linear(4, 3)


def _tensors(kind: str):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 4, generator=g), torch.arange(40) % 3
    return {
        "good": lambda: (x, y, x[:10], y[:10]),
        "mismatched": lambda: (x, y[:30], x[:10], y[:10]),
        "regression": lambda: (x, x[:, :1], x[:10], x[:10, :1]),
        "nan": lambda: (x * float("nan"), y, x[:10], y[:10]),
        "empty": lambda: (x[:0], y[:0], x[:0], y[:0]),
        "strings": lambda: ("x", "y", "x", "y"),
        "huge-labels": lambda: (x, y * 10**9, x[:10], y[:10]),
        "negative-labels": lambda: (x, y - 5, x[:10], y[:10]),
    }[kind]()


MODELS = {
    "none": lambda: None,
    "linear": lambda: nn.Linear(4, 3),
    "narrow": lambda: nn.Linear(4, 2),
    "wrong-input": lambda: nn.Linear(7, 3),
    "meta": _meta,
    "int64": _Long,
    "tuple": _Tuple,
    "raises": _Raises,
    "not-a-module": lambda: "model",
    "double": lambda: nn.Linear(4, 3).double(),
}
LOSSES = {
    "none": None,
    "cross_entropy": torch.nn.functional.cross_entropy,
    "string": lambda out, y: "loss",
    "vector": lambda out, y: out.sum(1),
    "raises": lambda out, y: 1 / 0,
    "not-callable": 3,
}
METRICS = {
    "none": None,
    "accuracy": {"acc": lambda out, y: (out.argmax(1) == y).float()},
    "round": {"round": lambda out, y: out.sum()},
    "string": {"s": lambda out, y: "x"},
    "nan": {"nan": lambda out, y: torch.tensor(float("nan"))},
    "bad-name": {3: lambda out, y: out.sum()},
    "script": {"<script>": lambda out, y: out.mean()},
    "list": [1, 2],
}
DATA = ["none", "good", "good", "mismatched", "regression", "nan", "empty", "strings", "huge-labels"]
DATA.append("negative-labels")
CONFIGS = {
    "tiny": lambda: {
        "name": "api",
        "rounds": 2,
        "partition": {"kind": "iid", "num_clients": 3},
        "engine": {"executor": "sequential"},
        "algorithm": {"fraction": 1.0, "local": {"steps": 1, "batch_size": 8}},
    },
    "42": lambda: 42,
    "none": lambda: None,
    "list": lambda: [1, 2],
    "missing-file": lambda: "no-such-config.toml",
    "bad-key": lambda: {"rounds": 2, "nope": 1},
    "hostile-rounds": lambda: {"rounds": 2**70},
    "builtin-model": lambda: {
        "rounds": 1,
        "model": {"kind": "mlp", "hidden": [3]},
        "partition": {"kind": "iid", "num_clients": 2},
        "engine": {"executor": "sequential"},
    },
}


CHOICES = {
    "config": sorted(CONFIGS),
    "model": sorted(MODELS),
    "data": DATA,
    "loss": sorted(LOSSES),
    "metrics": sorted(METRICS),
    "out": ["default", "given", "float"],
    "overwrite": [True, False, "yes"],
}
VALID_CALL = {
    "config": "tiny",
    "model": "linear",
    "data": "good",
    "loss": "none",
    "metrics": "accuracy",
    "out": "given",
    "overwrite": True,
}
# a valid call with up to two of its arguments replaced: most calls get past the first check
CALLS = st.lists(st.sampled_from(sorted(CHOICES)), max_size=2, unique=True).flatmap(
    lambda names: st.fixed_dictionaries({name: st.sampled_from(CHOICES[name]) for name in names})
)


@settings(
    max_examples=fuzz_examples(10),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(CALLS)
def test_the_python_api_runs_or_fails_cleanly(sandbox, changed):
    """taciturn.run with every kind of argument a caller can get wrong: the result, or the layer's
    TaciturnError (one clean error type), and nothing outside the run folder changed."""
    call = VALID_CALL | changed
    kwargs = {
        "config": CONFIGS[call["config"]](),
        "model": MODELS[call["model"]](),
        "data": None if call["data"] == "none" else _tensors(call["data"]),
        "loss": LOSSES[call["loss"]],
        "metrics": METRICS[call["metrics"]],
        "out": {"default": None, "given": sandbox.out(), "float": 2.5}[call["out"]],
        "overwrite": call["overwrite"],
    }
    try:
        result = taciturn.run(**kwargs)
    except TaciturnError:
        pass
    else:
        assert result.metrics and result.metrics[-1]["round"] >= 1
    finally:
        sandbox.check()


# ----- --overwrite keeps every file it did not write (issue 40) -----
USER_FILES = [
    "notes.txt",
    "plots/my_figure.png",
    "plots/accuracy_vs_round.png",
    "checkpoints/round_000004/my_thesis_data.csv",
    "checkpoints/round_000006/server.safetensors",
    "checkpoints/round_000099/x",
    "config.toml",
    "run.log",
    "metrics.jsonl",
    "report.html",
    "client_state.bin",
    "manifest.json",
    "sub/dir/file",
]


@settings(
    max_examples=fuzz_examples(6),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    placed=st.lists(st.sampled_from(USER_FILES), min_size=1, max_size=4, unique=True),
    replace=st.booleans(),
    a_run_first=st.booleans(),
)
def test_overwrite_keeps_every_file_it_did_not_write(
    finished, tmp_path_factory, capsys, placed, replace, a_run_first
):
    """User files put in a run folder (or in a folder of their own) beside or instead of taciturn's:
    `run --overwrite` either refuses or runs, and every one of them is left as it was."""
    root = tmp_path_factory.mktemp("overwrite")
    out = root / "run"
    if a_run_first:
        shutil.copytree(finished, out)
    out.mkdir(exist_ok=True)
    mine = {}
    for name in placed:
        path = out / name
        if path.exists() and not replace:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            continue
        path.write_bytes(b"the user's own " + name.encode())
        mine[name] = path.read_bytes()
    config = root / "c.toml"
    config.write_text(to_toml(tiny_config(rounds=2)))
    capsys.readouterr()
    code = main(["run", str(config), "--out", str(out), "--overwrite", "--quiet"])
    err = capsys.readouterr().err
    assert code in (0, 2) and "Traceback" not in err, err
    for name, data in mine.items():
        assert (out / name).read_bytes() == data, f"{name} was replaced or deleted"
