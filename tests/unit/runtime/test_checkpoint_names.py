"""The step-NNNNNN names of checkpoint folders and their steps, both ways."""

from __future__ import annotations

import pytest

from components.runtime.checkpoint import step_dir_name, step_of


@pytest.mark.parametrize("step", [1, 30, 999_999, 1_234_567])
def test_step_of_inverts_step_dir_name(step, tmp_path):
    assert step_of(step_dir_name(step)) == step
    assert step_of(tmp_path / "checkpoints" / step_dir_name(step)) == step


@pytest.mark.parametrize("name", ["step-1", "step-00000x", "final", "step-000001.tmp", ""])
def test_step_of_refuses_other_names(name):
    with pytest.raises(ValueError, match="not a step-NNNNNN checkpoint folder"):
        step_of(name)
