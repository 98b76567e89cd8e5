"""Fuzzing hostile input (hypothesis): codec bytes, configs, and tamperings of every file of a run
directory followed by resume and report. Every case ends in a clean error (the layer's
TaciturnError; exit code 2 from the CLI, one line, no traceback) or in the right result: never
another exception, never a silently accepted corruption, never a lost file.

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
from conftest import fuzz_examples, tiny_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taciturn.cli import main
from taciturn.core.codec import CodecError, decode, encode
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


TAMPERS = ["flip", "truncate", "append", "delete", "garbage", "empty"]


def _tamper(path, how: str, at: float) -> None:
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
    if crashed:
        shutil.rmtree(RunDir(run).checkpoint_dir(6))
    files = [f for f in _files(run) if not f.startswith(".taciturn")]
    target = files[int(pick * len(files))]
    _tamper(run / target, how, at)
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
