"""Search space: suggestions, tied epsilon, configurable ranges, overrides that round-trip."""

from __future__ import annotations

import math

import optuna
import pytest
import yaml
from helpers.params import defaults_params

from components.config import Config, ConfigError, load_config
from components.search.space import (
    DEFAULT_SPACE,
    CategoricalParam,
    FloatParam,
    IntParam,
    SearchSpace,
    SearchSpaceError,
    TiedParam,
    apply_overrides,
    format_value,
    suggest,
)

FIXED = {"reward.lambda_tok": 0.05, "budget.target": 350.0, "gspo.lr": 2e-6, "gspo.group_size": 8,
         "gspo.eps_low": 3e-4, "mas.agents": 4, "mas.rounds": 2, "mas.topology": "star"}


def test_default_space_covers_the_briefed_parameters() -> None:
    assert list(DEFAULT_SPACE) == ["reward.lambda_tok", "budget.target", "gspo.lr", "gspo.group_size",
                                   "gspo.eps_low", "gspo.eps_high", "mas.agents", "mas.rounds", "mas.topology"]
    assert DEFAULT_SPACE["reward.lambda_tok"].log and DEFAULT_SPACE["gspo.lr"].log  # type: ignore[union-attr]
    assert set(DEFAULT_SPACE["mas.topology"].choices) == {  # type: ignore[union-attr]
        "complete", "chain", "star", "layered", "debate"}


def test_suggest_returns_overrides_with_tied_eps_high_that_load_config_accepts(tmp_path) -> None:
    overrides = suggest(optuna.trial.FixedTrial(FIXED))
    as_dict = dict(o.split("=", 1) for o in overrides)
    assert as_dict["mas.topology"] == "star" and as_dict["mas.agents"] == "4"
    assert math.isclose(float(as_dict["gspo.eps_high"]), 4e-4)
    cfg = load_config(defaults_params(tmp_path), overrides=overrides)
    assert cfg.reward.lambda_tok == 0.05 and cfg.gspo.lr == 2e-6 and cfg.gspo.group_size == 8
    assert math.isclose(cfg.gspo.eps_high / cfg.gspo.eps_low, 4 / 3)
    assert cfg == apply_overrides(Config(), overrides).model_copy(update={"profile": cfg.profile})


def test_sampled_values_stay_inside_the_ranges() -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    space = SearchSpace()
    for _ in range(30):
        values = space.sample(study.ask())
        assert 1e-3 <= values["reward.lambda_tok"] <= 1.0
        assert values["gspo.group_size"] in (4, 8, 12, 16)
        assert 2 <= values["mas.agents"] <= 5 and 1 <= values["mas.rounds"] <= 3
        assert values["budget.target"] % 50 == 0
        apply_overrides(Config(), space.suggest(optuna.trial.FixedTrial(values)))


@pytest.mark.parametrize("value", [1e-06, 3.0e-4, 0.1, 400.0, 8, True, "debate", "1", None])
def test_format_value_round_trips_through_yaml(value: object) -> None:
    assert yaml.safe_load(format_value(value)) == value


def test_ranges_are_configurable_and_none_fixes_a_key() -> None:
    space = SearchSpace({"mas.agents": IntParam(3, 3), "mas.topology": None,
                         "gspo.kl_beta": FloatParam(0.0, 0.1)})
    assert "mas.topology" not in space.specs and list(space.specs)[-1] == "gspo.kl_beta"
    values = space.sample(optuna.create_study().ask())
    assert values["mas.agents"] == 3 and 0.0 <= values["gspo.kl_beta"] <= 0.1


@pytest.mark.parametrize(("ranges", "match"), [
    ({"mas.agentz": IntParam(1, 2)}, "not a config key"),
    ({"reward.lambda_tok": FloatParam(1.0, 0.1)}, "low 1.0 must be <= high"),
    ({"reward.lambda_tok": FloatParam(0.0, 1.0, log=True)}, "log range needs low > 0"),
    ({"gspo.eps_low": None}, "tied to 'gspo.eps_low', which must be a searched"),
    ({"mas.topology": CategoricalParam(())}, "choices must not be empty"),
    ({"gspo.kl_beta": TiedParam("gspo.lr", -1.0)}, "ratio must be a positive"),
])
def test_bad_space_entries_name_the_key(ranges: dict, match: str) -> None:
    with pytest.raises(SearchSpaceError, match=match):
        SearchSpace(ranges)


def test_apply_overrides_rejects_values_outside_the_schema() -> None:
    with pytest.raises(ConfigError, match="mas.agents"):
        apply_overrides(Config(), ["mas.agents=0"])
