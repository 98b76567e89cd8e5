"""Bad configs fail before any work: every float finite and bounded where a huge value is a typo,
integers strictly integers (no strings or booleans), sizes checked against the machine's memory."""

import pytest
from conftest import tiny_config

from taciturn.experiments import types
from taciturn.experiments.config import ConfigError


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("algorithm__local__lr", float("inf"), "finite number"),
        ("algorithm__local__lr", 1e308, "less than or equal to 1000000"),
        ("algorithm__local__weight_decay", float("inf"), "finite number"),
        ("algorithm__server_lr", float("inf"), "finite number"),
        ("data__separation", float("inf"), "finite number"),
        ("data__separation", 1e308, "less than or equal to 1000000"),
        ("algorithm__local__lr", float("nan"), "finite number"),
        ("engine__workers", 10**6, "less than or equal to 4096"),
        ("algorithm__local__steps", 10**12, "less than or equal to 10000000"),
        ("rounds", 2**63 - 1, "less than or equal to 10000000"),
        ("rounds", "10", "rounds must be a number, not str '10'"),
        ("rounds", True, "rounds must be a number, not bool True"),
        ("partition__num_clients", True, "num_clients must be a number, not bool"),
        ("algorithm__fraction", True, "fraction must be a number, not bool"),
        ("algorithm__local__lr", "0.1", "lr must be a number, not str"),
        ("seed", 2**64, "less than 9223372036854775808"),
    ],
)
def test_bad_values_are_config_errors(key, value, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        tiny_config(**{key: value})


def test_numbers_inside_arrays_are_strict_too():
    with pytest.raises(ConfigError, match="hidden must be a number, not str '3'"):
        tiny_config(model__kind="mlp", model__hidden=["3"])
    assert tiny_config(model__kind="mlp", model__hidden=[3]).model.hidden == (3,)
    assert tiny_config(algorithm__local__lr=1).algorithm.local.lr == 1.0  # an integer is a number


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model__kind": "mlp", "model__hidden": [10**10]}, r"\[model\] a model of [\d,]+ parameters"),
        ({"data__num_samples": 10**12}, r"\[data\] 1,000,000,000,000 synthetic samples"),
    ],
)
def test_sizes_beyond_the_machine_fail_before_any_allocation(tmp_path, overrides, message):
    with pytest.raises(
        ConfigError, match=message + r".* GiB \(this machine's memory\); .*TACITURN_MAX_MEMORY_GIB"
    ):
        types.start(tiny_config(**overrides), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_a_config_file_of_binary_garbage_is_a_config_error(tmp_path, capsys):
    from taciturn.cli import main

    path = tmp_path / "c.toml"
    path.write_bytes(bytes(range(256)))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "is not valid TOML" in err and "Traceback" not in err


def test_optional_numbers_and_numbers_in_optional_tuples_are_strict_and_text_fields_are_not():
    """The rule reaches through ``X | None`` and through tuples of annotated numbers, and leaves
    fields that may hold text alone (a ``str | None`` or an ``int | tuple[str, ...]``)."""
    from typing import Annotated

    from pydantic import Field, ValidationError

    from taciturn.algorithms.base import StrictModel

    class Options(StrictModel):
        count: int | None = None
        scale: float | None = None
        sizes: tuple[Annotated[int, Field(ge=0)], ...] | None = None
        address: str | None = None
        held_out: int | tuple[str, ...] = 0
        tags: tuple[str, ...] = ()

    for tree, message in (
        ({"count": "10"}, "count must be a number, not str '10'"),
        ({"count": True}, "count must be a number, not bool True"),
        ({"scale": "0.5"}, "scale must be a number, not str '0.5'"),
        ({"sizes": [1, "2"]}, "sizes must be a number, not str '2'"),
        ({"sizes": [False]}, "sizes must be a number, not bool False"),
    ):
        with pytest.raises(ValidationError, match=message):
            Options(**tree)
    options = Options(count=3, scale=1, sizes=[1, 2], address="auto", held_out=["a", "b"])
    assert (options.count, options.scale, options.sizes) == (3, 1.0, (1, 2))
    assert (options.address, options.held_out) == ("auto", ("a", "b"))
    assert Options(held_out=4).held_out == 4 and Options(tags=["a", "b"]).tags == ("a", "b")
