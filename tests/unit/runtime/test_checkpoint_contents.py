"""Checkpoint files that parse but hold the wrong contents, the resume-compatibility hash, write errors
while the final policy is saved, file modes of written folders, and a resumed run whose MLflow run is
gone: each one error naming the file (exit 2), or a run that goes on."""

from __future__ import annotations

import errno
import json
import os
import pickle
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.paths import REPO_ROOT, load_test_module
from safetensors.torch import load_file, save_file

from components.config import load_config
from components.errors import UserError, run_command
from components.io import atomic_dir, environment_error
from components.runtime.checkpoint import CheckpointError, load_checkpoint, read_meta, save_checkpoint
from components.runtime.resume import check_resume_config, load_train_state, read_train_state, resume_hash

test_tracking_helpers = load_test_module("test_tracking_helpers")
torch_engine = load_test_module("test_checkpoint").torch_engine
train = load_test_module("test_checkpoint").train

PARAMS = REPO_ROOT / "params.yaml"
mlflow_uri = test_tracking_helpers.mlflow_uri  # shared pytest fixture
INCOMPATIBLE = "corrupt or incompatible checkpoint"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _state(step: int = 1) -> dict:
    """A trainer state as :meth:`GSPOTrainer.state` writes it (plus the job's tracking keys)."""
    cfg = load_config(PARAMS)
    return {"step": step, "cursor": 2, "controller": {}, "history": [{"step": 1.0}], "config_hash": cfg.hash(),
            "resume_hash": resume_hash(cfg), "config_settings": {}, "budget_calibration": None,
            "mlflow_run_id": None, "mlflow_pending": [[1, 1000, {"train/reward": 0.5}]]}


@pytest.fixture()
def ckpt(tmp_path: Path) -> Path:
    eng = torch_engine()
    train(eng, 1)
    return save_checkpoint(tmp_path, 1, eng, extra=_state())


@pytest.mark.parametrize(("change", "reason"), [
    ({"step": 99}, "step 99 but the folder is step-000001"),
    ({"step": "abc", "world_size": "x"}, "step 'abc' is not a step number"),
    ({"world_size": 0}, "world_size 0 is not a number of ranks"),
    ({"extra_format": "yaml"}, "extra_format 'yaml'"),
    ({"version": 7}, "format version 7"),
])
def test_meta_with_wrong_values_is_refused_naming_it(ckpt: Path, change: dict, reason: str) -> None:
    meta = json.loads((ckpt / "meta.json").read_text())
    (ckpt / "meta.json").write_text(json.dumps(meta | change))
    with pytest.raises(CheckpointError, match=f"{ckpt / 'meta.json'}: {INCOMPATIBLE} \\({reason}"):
        read_meta(ckpt)


@pytest.mark.parametrize(("part", "content", "reason"), [
    ("engine/engine_state.pt", {}, r"torch engine state lacks \['optimizer', 'scheduler', 'steps'\]"),
    ("engine/engine_state.pt", {"optimizer": {}, "scheduler": {}, "steps": 1}, "KeyError|ValueError"),
    ("rng/rank-00000.pt", {}, r"RNG state lacks \['python', 'numpy', 'torch'\]"),
])
def test_engine_and_rng_states_without_their_keys_are_one_error_naming_the_file(ckpt: Path, part: str,
                                                                                content: dict, reason: str) -> None:
    torch.save(content, ckpt / part)
    with pytest.raises(CheckpointError, match=f"{ckpt / part}: {INCOMPATIBLE} \\(.*({reason})"):
        load_checkpoint(ckpt, torch_engine())


def test_weights_of_another_shape_or_not_finite_are_one_error_naming_the_file(ckpt: Path) -> None:
    file = ckpt / "model" / "model.safetensors"
    good = load_file(str(file))
    key = next(iter(good))
    save_file(good | {key: torch.zeros(3, 3)}, str(file), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"{file}: {INCOMPATIBLE} \\(weight {key} has shape \\[3, 3\\]"):
        load_checkpoint(ckpt, torch_engine())
    save_file({k: torch.full_like(v, float("nan")) for k, v in good.items()}, str(file), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"{file}: {INCOMPATIBLE} \\(weight .* holds NaN"):
        load_checkpoint(ckpt, torch_engine())


@pytest.mark.parametrize(("change", "reason"), [
    ("empty", "no step, cursor, controller, history, config_hash"),
    ({"cursor": "abc"}, "cursor 'abc' is not a question count"),
    ({"history": {"a": 1}}, "history .* is not a list of metric mappings"),
    ({"mlflow_pending": [[1, "x"]]}, "mlflow_pending .* is not a list of"),
    ({"step": 2}, "step 2 but meta.json says 1"),
    ("no hash", "no config_hash"),
])
def test_trainer_state_without_its_keys_or_of_wrong_types_is_refused_naming_it(ckpt: Path, change, reason) -> None:
    state = _state()
    if change == "empty":
        state = {}
    elif change == "no hash":
        del state["config_hash"]
    else:
        state |= change
    extra = ckpt / "extra.json"
    extra.write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match=f"{extra}: {INCOMPATIBLE} \\({reason}"):
        read_train_state(ckpt)


def test_a_pickled_state_is_checked_too(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, 3, torch_engine(), extra=_state(3) | {"pair": (1, 2)})
    assert read_meta(path).extra_format == "pickle" and read_train_state(path)["step"] == 3
    with open(path / "extra.pkl", "wb") as fh:
        pickle.dump(_state(3) | {"controller": None}, fh)
    with pytest.raises(CheckpointError, match=f"{path / 'extra.pkl'}: {INCOMPATIBLE} \\(controller None"):
        read_train_state(path)


def test_applying_a_state_that_does_not_fit_names_the_state_file(ckpt: Path) -> None:
    """KeyError / ValueError / TypeError / RuntimeError while the state is applied, and the budget
    controller's own check, are the same one error (never a traceback, never a fresh start)."""
    from components.reward.budget import BudgetError

    for exc in (KeyError("step"), ValueError("invalid literal for int()"), TypeError("bad operand"),
                RuntimeError("size mismatch"), BudgetError("budget controller state: missing keys ['lr']")):
        def boom(state: dict, exc: Exception = exc) -> None:
            raise exc

        with pytest.raises(CheckpointError, match=f"{ckpt / 'extra.json'}: {INCOMPATIBLE} \\(.*"
                                                  f"{str(exc).strip(chr(39))[:10]}"):
            load_train_state(SimpleNamespace(load_state=boom), _state(), ckpt)


def test_resume_hash_leaves_out_settings_that_cannot_change_the_weights() -> None:
    base = load_config(PARAMS)
    free = ["eval.limit=3", "registry.model_name=other", "search.trials=3", "gspo.keep_checkpoints=1",
            "gspo.checkpoint_every=7", "gspo.out_dir=elsewhere", "tracking.experiment=x"]
    moved = load_config(PARAMS, overrides=free)
    assert resume_hash(moved) == resume_hash(base)
    assert moved.hash() != base.hash()  # Config.hash (tags runs and versions) is unchanged in meaning
    check_resume_config(_state(), moved)
    other = load_config(PARAMS, overrides=["gspo.lr=0.5"])
    assert resume_hash(other) != resume_hash(base)
    with pytest.raises(UserError, match="config hash differs"):
        check_resume_config(_state(), other)
    no_hash = {k: v for k, v in _state().items() if k != "config_hash"}
    with pytest.raises(UserError, match="no config hash"):
        check_resume_config(no_hash, base)  # once skipped: a foreign state resumed under any config
    old = {k: v for k, v in _state().items() if k != "resume_hash"}  # written before resume hashes
    check_resume_config(old, base)
    with pytest.raises(UserError, match="config hash differs"):
        check_resume_config(old, moved)


def test_a_checkpoint_from_before_a_setting_existed_resumes_at_its_default_only() -> None:
    """A schema update adds a setting (its default keeps the old behaviour): checkpoints written
    before it store settings without it and a resume hash of the old schema. They resume while the
    new setting is at its default, and are refused, naming it, once it is not."""
    from components.runtime.resume import resume_settings

    base = load_config(PARAMS)
    settings = resume_settings(base)
    assert settings["gspo.lr_min_ratio"] == 0.0
    before = _state() | {"resume_hash": "0" * 64,  # the old schema's hash: not this one's
                         "config_settings": {k: v for k, v in settings.items() if k != "gspo.lr_min_ratio"}}
    check_resume_config(before, base)
    check_resume_config(before, load_config(PARAMS, overrides=["eval.limit=3"]))  # free settings still free
    with pytest.raises(UserError, match=r"gspo.lr_min_ratio '<unset>' -> 0.25"):
        check_resume_config(before, load_config(PARAMS, overrides=["gspo.lr_min_ratio=0.25"]))
    with pytest.raises(UserError, match=r"gspo.lr 2e-05 -> 0.5"):  # a stored setting that changed
        check_resume_config(before | {"config_settings": settings | {"gspo.lr": 2e-05}},
                            load_config(PARAMS, overrides=["gspo.lr=0.5"]))
    with pytest.raises(UserError, match="config hash differs"):  # nothing stored: nothing to compare
        check_resume_config(before | {"config_settings": {}}, base)
    removed = before | {"config_settings": settings | {"gspo.gone": 1}}  # a setting the schema dropped
    with pytest.raises(UserError, match=r"gspo.gone 1 -> '<unset>'"):
        check_resume_config(removed, base)


def test_write_errors_wrapped_by_libraries_are_reported_as_what_they_are(tmp_path: Path, capsys) -> None:
    target = tmp_path / "final"
    for text, code in (("No space left on device (os error 28)", errno.ENOSPC),
                       ("Error while serializing: IoError(Os { code: 30, message: \"Read-only file system\" })",
                        errno.EROFS), ("Disk quota exceeded", errno.EDQUOT)):
        mapped = environment_error(Exception(text), target)
        assert mapped is not None and mapped.errno == code and mapped.filename == str(target)
    assert environment_error(OSError(errno.ENOSPC, "No space left on device", "/x/.final.tmp"), target).filename \
        == str(target)
    assert environment_error(RuntimeError("a bug"), target) is None
    assert environment_error(UserError("No space left on device"), target) is None

    def fails() -> int:
        raise environment_error(Exception("No space left on device (os error 28)"), target)

    assert run_command("agent-gspo train", fails) == 2
    assert capsys.readouterr().err == f"agent-gspo train: error: No space left on device: {target}\n"


class _Engine:
    """Enough of a TrainEngine for :func:`_finalise` on one rank."""

    def __init__(self, module: object) -> None:
        self.module, self.dist = module, SimpleNamespace(is_main=True)

    def gathered_parameters(self):
        import contextlib

        return contextlib.nullcontext()


def _finalise(tmp_path: Path, tokenizer_error: Exception | None = None) -> None:
    from components.runtime.training_run import TrainResult, _finalise, _Run

    class Tokenizer:
        def save_pretrained(self, folder: Path) -> None:
            (Path(folder) / "tokenizer.json").write_text("{}")
            if tokenizer_error is not None:
                raise tokenizer_error

    class Module:
        def save_pretrained(self, folder: Path) -> None:
            (Path(folder) / "model.safetensors").write_bytes(b"w")

    cfg = load_config(PARAMS)
    trainer = SimpleNamespace(history=[{"step": 1.0, "train/reward": 0.5}], step_idx=1, budget_calibration=None)
    _finalise(_Run(cfg, tmp_path, _Engine(Module()), Tokenizer(), trainer), None, TrainResult(tmp_path, None, 1))


def test_a_full_disk_while_the_final_policy_is_written_names_final(tmp_path: Path, monkeypatch) -> None:
    """tokenizers reports ENOSPC as a bare Exception: exit 2 naming final/, and no staging folder left."""
    with pytest.raises(OSError) as err:
        _finalise(tmp_path, Exception("No space left on device (os error 28)"))
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(tmp_path / "final")
    assert sorted(p.name for p in tmp_path.iterdir()) == []

    import components.runtime.training_run as training_run

    def read_only(target, obj) -> None:
        raise OSError(errno.EROFS, "Read-only file system", f"{target}.abc.tmp")

    monkeypatch.setattr(training_run, "write_json_atomic", read_only)
    with pytest.raises(OSError) as err:
        _finalise(tmp_path)
    assert err.value.errno == errno.EROFS and err.value.filename == str(tmp_path / "metrics.json")


def test_library_written_files_get_the_umask_modes(tmp_path: Path) -> None:
    """transformers writes model.safetensors 0600: final/, the registry copy (atomic_dir) and
    checkpoints must be readable as the umask allows, like every other file there."""
    mask = _umask()
    with atomic_dir(tmp_path / "final") as staging:
        (staging / "model.safetensors").write_bytes(b"w")
        os.chmod(staging / "model.safetensors", 0o600)
        (staging / "sub").mkdir()
        os.chmod(staging / "sub", 0o700)
    assert stat.S_IMODE((tmp_path / "final" / "model.safetensors").stat().st_mode) == 0o666 & ~mask
    assert stat.S_IMODE((tmp_path / "final" / "sub").stat().st_mode) == 0o777 & ~mask
    path = save_checkpoint(tmp_path / "run", 1, torch_engine(), extra={})
    for file in (path / "model").iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == 0o666 & ~mask, file


def test_a_resumed_run_whose_mlflow_run_is_gone_goes_on_in_a_new_run(mlflow_uri: str, capsys) -> None:
    """A run deleted on the server (or never there: the URI moved) is replaced by a new run tagged
    with the old id, with one warning; without ``new_run_if_missing`` it stays an error."""
    from mlflow import MlflowClient

    from components.tracking import Tracker, TrackingError
    from components.tracking.mlflow_logging import RESUMED_FROM_TAG, Resume

    with Tracker(mlflow_uri, "exp", "train") as first:
        old = first.run_id
    client = MlflowClient(mlflow_uri)
    client.delete_run(old)
    with pytest.raises(TrackingError, match="start run failed"):
        with Tracker(mlflow_uri, "exp", "train", resume=Resume(old)):
            pass
    for gone in (old, "0" * 32):  # deleted here; never logged here
        with Tracker(mlflow_uri, "exp", "train", resume=Resume(gone, new_run_if_missing=True)) as again:
            assert again.run_id != gone and again.resumed_from == gone
        assert client.get_run(again.run_id).data.tags[RESUMED_FROM_TAG] == gone
        err = capsys.readouterr().err
        assert f"MLflow run {gone} is not on {mlflow_uri}" in err and f"new run {again.run_id}" in err
        assert "metrics of the earlier steps stay" in err
    with Tracker(mlflow_uri, "exp", "train", resume=Resume(again.run_id, new_run_if_missing=True)) as same:
        assert same.run_id == again.run_id and same.resumed_from is None  # still there: continued
