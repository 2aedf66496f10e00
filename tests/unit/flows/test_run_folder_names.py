"""Two flow runs of one deployment started in the same second get two folders.

Was: the folder was named ``<UTC second>-<first 8 hex of the flow run id>``, but Prefect's server
makes flow run ids UUIDv7, whose first 8 hex are the top of a millisecond timestamp: equal for every
run created within ~65 s of another (two ``prefect deployment run`` calls, or a schedule's run and
a manual one, picked up by one worker poll). Two such runs wrote into one folder, the second
training over the first with ``--overwrite``."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from helpers.paths import REPO_ROOT
from prefect._internal.uuid7 import uuid7

from components.errors import UserError
from components.jobs import ConfigSource
from flows.run_folders import SCHEDULED_ROOT, check_run_root, dated_folder, study_override


def test_runs_created_and_started_together_get_their_own_folders() -> None:
    now = datetime(2026, 12, 6, 2, 0, 5, tzinfo=UTC)
    first, second = uuid7(), uuid7()  # what the server assigns to two runs created within a minute
    assert str(first)[:8] == str(second)[:8]  # the old name's part of the id
    a = dated_folder("runs/scheduled", "agent-gspo-evaluate", str(first), now)
    b = dated_folder("runs/scheduled", "agent-gspo-evaluate", str(second), now)
    assert a != b
    assert a.name == f"20261206T020005Z-{first}"  # the id as the Prefect UI and logs print it


def test_a_run_root_inside_a_dvc_output_is_refused_before_anything_is_written(tmp_path) -> None:
    """Was: run_root=eval wrote eval/agent-gspo-evaluate/<stamp>-<id>/, logging "never into DVC's
    outputs"; `dvc status` then listed the evaluate stage as changed."""
    for bad in ("eval", "eval/nightly", "runs/smoke/final", "metrics/eval", "data/gsm8k"):
        with pytest.raises(UserError, match=f"run_root {bad}: inside .*an output of dvc.yaml"):
            check_run_root(bad, REPO_ROOT)
    for good in (SCHEDULED_ROOT, "runs", "runs/smoke", "data", str(tmp_path)):
        check_run_root(good, REPO_ROOT)


def test_a_run_with_a_folder_searches_in_a_study_of_its_own_unless_told_which() -> None:
    """Was: every weekly search opened the study ``agent-gspo`` and found it finished (no trial) or run
    under another config (exit 2); tests/integration/test_weekly_search.py runs two weeks."""
    folder = dated_folder(SCHEDULED_ROOT, "agent-gspo-search", str(uuid7()), datetime(2026, 12, 6, 4, tzinfo=UTC))
    by_hand = ConfigSource(params=str(REPO_ROOT / "params.yaml"), profile="smoke")
    assert by_hand.load().search.study_name == "agent-gspo"  # `agent-gspo search`: resumable by name
    own = by_hand.plus([study_override("agent-gspo", folder)]).load().search.study_name
    assert own == f"agent-gspo-{folder.name}" and own.startswith("agent-gspo-20261206T040000Z-")
    told = ConfigSource(params=str(REPO_ROOT / "params.yaml"), profile="smoke", overrides=("search.study_name=x",))
    assert told.plus([study_override("x", folder)]).load().search.study_name == "x"  # the caller's own wins
