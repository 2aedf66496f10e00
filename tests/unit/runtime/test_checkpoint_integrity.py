"""Every file of a checkpoint carries its sha256 in ``meta.json``; ``--resume`` re-hashes them before
the model loads: one flipped byte anywhere is exit 2 naming the file and the fix; a checkpoint of
format 1 (no hashes) resumes with a warning."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT, load_test_module

from components.config import load_config
from components.errors import run_command
from components.runtime.checkpoint import CheckpointError, read_meta, save_checkpoint, verify_checkpoint
from components.runtime.run_folder import check_resumable

torch_engine = load_test_module("test_checkpoint").torch_engine
train = load_test_module("test_checkpoint").train
_state = load_test_module("test_checkpoint_contents")._state

PARAMS = REPO_ROOT / "params.yaml"
FIX = "delete the checkpoint folder"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    eng = torch_engine()
    train(eng, 1)
    return save_checkpoint(tmp_path_factory.mktemp("run"), 1, eng, extra=_state())


def _copy(saved: Path, tmp_path: Path) -> Path:
    import shutil

    out = tmp_path / "run"
    shutil.copytree(saved.parent.parent, out)
    return out / "checkpoints" / saved.name


def _flip(file: Path, offset: int) -> None:
    data = bytearray(file.read_bytes())
    data[offset % len(data)] ^= 0x01
    file.write_bytes(bytes(data))


def test_meta_lists_the_sha256_of_every_other_file(saved: Path) -> None:
    files = read_meta(saved).files
    on_disk = sorted(p.relative_to(saved).as_posix() for p in saved.rglob("*") if p.is_file())
    assert files is not None and sorted(files) == [f for f in on_disk if f != "meta.json"]
    assert {"model/model.safetensors", "engine/engine_state.pt", "rng/rank-00000.pt", "extra.json"} <= set(files)
    verify_checkpoint(saved)  # as written: no error


@pytest.mark.parametrize("name", ["model/model.safetensors", "engine/engine_state.pt", "rng/rank-00000.pt",
                                  "extra.json", "model/config.json"])
def test_a_flipped_byte_in_any_file_is_exit_2_naming_it(saved: Path, tmp_path: Path, capsys, name: str) -> None:
    ckpt = _copy(saved, tmp_path)
    file = ckpt / name
    _flip(file, len(file.read_bytes()) // 2)
    with pytest.raises(CheckpointError, match=f"{file}: content changed .* {FIX} {ckpt}"):
        verify_checkpoint(ckpt)
    assert run_command("train", lambda: check_resumable(ckpt.parent.parent, load_config(PARAMS))) == 2
    err = capsys.readouterr().err
    assert str(file) in err and FIX in err and "Traceback" not in err


def test_low_bytes_of_1000_weights_flipped_are_refused(saved: Path, tmp_path: Path) -> None:
    """The finding: low mantissa bits parse and stay finite, so only the hash notices."""
    ckpt = _copy(saved, tmp_path)
    file = ckpt / "model" / "model.safetensors"
    data = bytearray(file.read_bytes())
    start = 8 + struct.unpack("<Q", data[:8])[0]  # safetensors: u64 header length, JSON header, tensors
    for i in range(1000):
        data[start + 4 * i] ^= 0x01  # lowest byte of a little-endian float32
    file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model.safetensors: content changed"):
        check_resumable(ckpt.parent.parent, load_config(PARAMS))


def test_a_missing_or_an_added_file_is_refused(saved: Path, tmp_path: Path) -> None:
    ckpt = _copy(saved, tmp_path)
    (ckpt / "rng" / "rank-00001.pt").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=f"{ckpt / 'rng' / 'rank-00001.pt'}: not part of the checkpoint"):
        verify_checkpoint(ckpt)
    (ckpt / "rng" / "rank-00001.pt").unlink()
    (ckpt / "extra.json").unlink()
    with pytest.raises(CheckpointError, match=f"{ckpt / 'extra.json'}: missing from the checkpoint"):
        verify_checkpoint(ckpt)


def test_hashes_that_are_not_hashes_are_refused(saved: Path, tmp_path: Path) -> None:
    ckpt = _copy(saved, tmp_path)
    meta = json.loads((ckpt / "meta.json").read_text())
    (ckpt / "meta.json").write_text(json.dumps(meta | {"files": {"extra.json": "abc"}}))
    with pytest.raises(CheckpointError, match="files is not a mapping of file names to sha256 hashes"):
        read_meta(ckpt)


def test_a_format_1_checkpoint_resumes_with_a_warning(saved: Path, tmp_path: Path, capsys) -> None:
    ckpt = _copy(saved, tmp_path)
    meta = json.loads((ckpt / "meta.json").read_text())
    del meta["files"]
    (ckpt / "meta.json").write_text(json.dumps(meta | {"version": 1}))
    check_resumable(ckpt.parent.parent, load_config(PARAMS))
    err = capsys.readouterr().err
    assert "holds no file hashes" in err and "without an integrity check" in err


def test_a_nan_optimizer_state_is_refused_even_with_matching_hashes(saved: Path, tmp_path: Path) -> None:
    """Someone who rewrites meta.json too gets past the hashes; a non-finite Adam moment is still refused."""
    import torch

    from components.runtime.checkpoint import load_checkpoint
    from components.runtime.checkpoint_integrity import hash_files

    ckpt = _copy(saved, tmp_path)
    file = ckpt / "engine" / "engine_state.pt"
    state = torch.load(file, weights_only=False)
    next(iter(state["optimizer"]["state"].values()))["exp_avg"].fill_(float("nan"))
    torch.save(state, file)
    meta = json.loads((ckpt / "meta.json").read_text())
    (ckpt / "meta.json").write_text(json.dumps(meta | {"files": hash_files(ckpt)}))
    verify_checkpoint(ckpt)
    with pytest.raises(CheckpointError, match=f"{file}: corrupt or incompatible checkpoint \\(optimizer state exp_avg"):
        load_checkpoint(ckpt, torch_engine())
