"""A sandboxed program cannot grow the host's shared memory past the sandbox's memory limit, nor
its memory in all (shared plus anonymous, summed over its processes) past
:func:`~components.scoring.sandbox.memory_bound_mb`: memfd files (written, mapped, from forked
children), POSIX shm in /dev/shm, many small files, a sparse file, SysV segments, forked children
and subprocesses each allocating, threads, everything at once -- as root, as root without
CAP_SYS_ADMIN and as uid 65534. Each case runs ``sandbox_memory_probe.py`` in a child process that
lowers its own privileges first and samples, from outside, ``Shmem`` in ``/proc/meminfo`` and the
``RssAnon`` of every process below it while the program runs."""
import json
import os
import subprocess
import sys

import pytest
from helpers.paths import REPO_ROOT, find_under_tests

from components.scoring.sandbox import UNSAFE_ENV

PROBE = find_under_tests("sandbox_memory_probe.py")
REPO = REPO_ROOT
SLACK_MB = 128  # other processes of the machine (and other tests) share /proc/meminfo's Shmem
ATTACKS = ["memfd", "memfd-mmap", "fork-memfd", "dev-shm", "many-files", "sparse", "sysv-shm", "fork-anon",
           "subprocess-anon", "threads-anon", "everything"]
SCENARIOS = ["as-is", "nobody", "no-sys-admin"] if os.geteuid() == 0 else ["as-is"]


def _probe(scenario: str, attack: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != UNSAFE_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(PROBE.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, str(PROBE), scenario, attack], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("attack", ATTACKS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_shared_memory_stays_under_the_limit(scenario: str, attack: str) -> None:
    out = _probe(scenario, attack)
    if "skip" in out:
        pytest.skip(out["skip"])
    assert out["grew_mb"] <= out["limit_mb"] + SLACK_MB, out
    # all of it, summed over every process: the address space of one process plus the scratch tmpfs
    assert out["total_mb"] <= out["bound_mb"] + SLACK_MB, out
    assert not out["passed"], f"a program that tried to keep 2 GB passed: {out}"
