"""Two flow runs of one deployment started in the same second get two folders.

Was: the folder was named ``<UTC second>-<first 8 hex of the flow run id>``, but Prefect's server
makes flow run ids UUIDv7, whose first 8 hex are the top of a millisecond timestamp: equal for every
run created within ~65 s of another (two ``prefect deployment run`` calls, or a schedule's run and
a manual one, picked up by one worker poll). Two such runs wrote into one folder, the second
training over the first with ``--overwrite``."""

from __future__ import annotations

from datetime import UTC, datetime

from prefect._internal.uuid7 import uuid7

from flows.run_folders import dated_folder


def test_runs_created_and_started_together_get_their_own_folders() -> None:
    now = datetime(2026, 12, 6, 2, 0, 5, tzinfo=UTC)
    first, second = uuid7(), uuid7()  # what the server assigns to two runs created within a minute
    assert str(first)[:8] == str(second)[:8]  # the old name's part of the id
    a = dated_folder("runs/scheduled", "agent-gspo-evaluate", str(first), now)
    b = dated_folder("runs/scheduled", "agent-gspo-evaluate", str(second), now)
    assert a != b
    assert a.name == f"20261206T020005Z-{first}"  # the id as the Prefect UI and logs print it
