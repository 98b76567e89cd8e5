"""The Ray executor's config: errors before any work starts (no cluster needed)."""

import importlib.util

import pytest

from taciturn.experiments.config import ConfigError
from taciturn.experiments.runner import prepare
from tests.conftest import tiny_config


def test_a_missing_ray_is_a_config_error_that_names_the_extra(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a)
    )
    with pytest.raises(ConfigError, match=r"taciturn\[ray\]"):
        prepare(tiny_config(engine={"executor": "ray"}), tmp_path)


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"executor": "parallel", "ray_address": "auto"}, "ray_address only apply to executor = 'ray'"),
        ({"executor": "ray", "ray_cpus_per_worker": 0}, "greater than 0"),
        ({"executor": "ray", "ray_gpus_per_worker": -0.5}, "greater than or equal to 0"),
    ],
)
def test_bad_ray_settings_fail_validation(engine, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(engine=engine)


def test_analysis_needs_the_updates_in_this_process():
    with pytest.raises(ConfigError, match="Ray workers send back only their reduced share"):
        tiny_config(engine={"executor": "ray"}, analysis={"divergence": True})
