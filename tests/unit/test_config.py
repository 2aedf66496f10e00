"""Config schema: params.yaml validates, profiles merge, bad input names the key path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers.paths import REPO_ROOT

from components.cli import main
from components.config import Config, ConfigError, load_config

ROOT = REPO_ROOT
PARAMS = ROOT / "params.yaml"


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_committed_params_validate_for_every_profile():
    raw = yaml.safe_load(PARAMS.read_text())
    for profile in raw["profiles"]:
        cfg = load_config(PARAMS, profile)
        assert cfg.profile == profile
    smoke = load_config(PARAMS, "smoke")
    assert smoke.gspo.steps < load_config(PARAMS, "default").gspo.steps


def test_committed_params_list_every_schema_key():
    raw = yaml.safe_load(PARAMS.read_text())
    for section, field in Config.model_fields.items():
        if section == "profile" or not hasattr(field.annotation, "model_fields"):
            continue  # experiments: the study's section (tests/experiments/test_study_cli.py checks it)
        assert section in raw, f"params.yaml lacks section {section}"
        missing = set(field.annotation.model_fields) - set(raw[section])
        assert not missing, f"params.yaml section {section} lacks {missing}"


def test_unknown_key_names_path_and_allowed(tmp_path):
    path = _write(tmp_path, {"gspo": {"eps_lo": 0.1}})
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert "gspo.eps_lo" in msg and "unknown key" in msg and "eps_low" in msg


def test_unknown_section(tmp_path):
    with pytest.raises(ConfigError, match="trainer: unknown key.*allowed sections"):
        load_config(_write(tmp_path, {"trainer": {}}))


def test_wrong_type_and_range(tmp_path):
    with pytest.raises(ConfigError, match="mas.agents"):
        load_config(_write(tmp_path, {"mas": {"agents": "three"}}))
    with pytest.raises(ConfigError, match=r"gspo.group_size.*greater than or equal to 2"):
        load_config(_write(tmp_path, {"gspo": {"group_size": 1}}))
    with pytest.raises(ConfigError, match=r"mas.topology.*'complete'"):
        load_config(_write(tmp_path, {"mas": {"topology": "ring"}}))


def test_profile_merge_and_override(tmp_path):
    path = _write(tmp_path, {"gspo": {"steps": 10, "lr": 1e-5},
                             "profiles": {"quick": {"gspo": {"steps": 2}}}})
    cfg = load_config(path, "quick", ["gspo.group_size=3"])
    assert (cfg.gspo.steps, cfg.gspo.lr, cfg.gspo.group_size) == (2, 1e-5, 3)
    with pytest.raises(ConfigError, match="unknown profile 'nope'"):
        load_config(path, "nope")


def test_custom_topology_needs_matrix(tmp_path):
    with pytest.raises(ConfigError, match="3x3 matrix"):
        load_config(_write(tmp_path, {"mas": {"topology": "custom", "agents": 3}}))


def test_config_hash_is_stable_and_sensitive():
    a, b = load_config(PARAMS), load_config(PARAMS)
    assert a.hash() == b.hash()
    assert a.hash() != load_config(PARAMS, overrides=["budget.target=123"]).hash()


def test_cli_bad_params_exit_2(tmp_path, capsys):
    path = _write(tmp_path, {"reward": {"lambda_tok": -1}})
    rc = main(["validate", "--params", str(path), "--data", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "reward.lambda_tok" in err and "greater than or equal to 0" in err


def test_mlflow_tracking_uri_env_beats_file_but_not_set(tmp_path, monkeypatch):
    path = _write(tmp_path, {"tracking": {"uri": "sqlite:///a.db"}})
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert load_config(path).tracking.uri == "http://127.0.0.1:5000"
    assert load_config(path, overrides=["tracking.uri=sqlite:///b.db"]).tracking.uri == "sqlite:///b.db"


def test_kl_reference_copy_under_zero3_is_refused_at_load_naming_the_keys():
    """A frozen full-weight reference copy of a ZeRO-3-partitioned model holds no weights: refused at
    config load unless LoRA provides the reference (adapters off) or the KL term is off."""
    match = r"gspo.kl_beta=0.1 .*deepspeed.zero_stage=3 needs model.lora_rank > 0"
    with pytest.raises(ConfigError, match=match) as exc:
        load_config(overrides=["gspo.kl_beta=0.1", "gspo.engine=deepspeed", "deepspeed.zero_stage=3"])
    assert "(got {" not in str(exc.value)  # the root error does not dump the whole config
    for ok in (["model.lora_rank=8"], ["deepspeed.zero_stage=2"], ["gspo.engine=torch"], ["gspo.kl_beta=0"]):
        load_config(overrides=["gspo.kl_beta=0.1", "gspo.engine=deepspeed", "deepspeed.zero_stage=3", *ok])


def test_questions_per_step_must_fill_every_rank_of_a_configured_launch():
    """2 nodes x 8 processes with the default 8 questions per step would leave ranks 8-15 without a
    question: refused at load, naming the keys; so is a split that gives some rank fewer messages
    than micro-batches. Without a configured launcher nothing is known about the world size here
    (the trainer checks WORLD_SIZE at start)."""
    two_by_eight = ["deepspeed.launcher=torchrun", "deepspeed.num_nodes=2", "deepspeed.nproc_per_node=8"]
    with pytest.raises(ConfigError, match=r"gspo.questions_per_step=8 must be a multiple of the world size 16.*"
                                          r"deepspeed.nproc_per_node=8 x deepspeed.num_nodes=2"):
        load_config(overrides=two_by_eight)
    assert load_config(overrides=[*two_by_eight, "gspo.questions_per_step=16"]).gspo.questions_per_step == 16
    few = ["deepspeed.launcher=deepspeed", "deepspeed.nproc_per_node=2", "gspo.questions_per_step=2",
           "gspo.group_size=2", "mas.agents=1", "gspo.minibatches=2", "gspo.grad_accum=2"]
    with pytest.raises(ConfigError, match=r"mas.agents = 2\) into gspo.minibatches x gspo.grad_accum = 4"):
        load_config(overrides=few)
    load_config(overrides=[*few, "gspo.grad_accum=1"])
    load_config(overrides=["gspo.questions_per_step=3"])  # launcher none: one process as far as the config knows


def test_trainer_refuses_a_world_size_that_leaves_a_rank_without_questions():
    """The runtime guard (torchrun started by hand, k8s, Slurm): before any collective, every rank
    raises the same clear error naming the key and WORLD_SIZE."""
    from components.errors import UserError
    from components.gspo.trainer import GSPOTrainer
    from components.runtime.distributed import DistInfo

    cfg = load_config(overrides=["gspo.questions_per_step=1"])
    for rank in (0, 1):
        with pytest.raises(UserError, match=r"gspo.questions_per_step=1 must be a multiple of the world size 2.*"
                                            r"WORLD_SIZE=2"):
            GSPOTrainer(cfg, None, None, ["item"], DistInfo(rank, 2, rank, rank == 0), pad_id=0)  # type: ignore[list-item]
