"""DeepSpeed's CPU all-reduce buffers in ``/dev/shm``: their names, and their removal.

Apart from :mod:`components.runtime.distributed` (which imports torch) because the launching
process sweeps them up after its ranks (:func:`components.runtime.launch.launch_training`), and
that process never loads torch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

SHM_DIR = "/dev/shm"


def deepspeed_shm_buffer(rank: int) -> str:
    """Path of the shared-memory all-reduce buffer DeepSpeed's CPU comm layer creates for ``rank``
    of this process's run: ``deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>``
    (``ops/csrc/cpu/comm/shm.cpp``)."""
    env = os.environ
    name = f"deepspeed_allreduce_buffer_{os.getuid()}_{env.get('MASTER_ADDR', '')}_{env.get('MASTER_PORT', '')}_{rank}"
    return os.path.join(SHM_DIR, name)


def unlink_deepspeed_shm_buffer(rank: int) -> bool:
    """Remove this rank's DeepSpeed all-reduce buffer from ``/dev/shm``; True when one was there.

    Why: DeepSpeed (0.19) creates a 66 MB tmpfs file per rank when its comm layer starts on CPU and
    never unlinks it, so every CPU run (each test, Optuna trial, smoke pipeline) left ~66 MB x ranks
    of RAM behind: 2.8 GB after a day on a 24 GB machine, enough to get the next training run
    OOM-killed. By now every rank has mapped every buffer during initialisation, and unlinking
    keeps existing mappings valid, so each rank removes its own name at shutdown. A rank killed by
    a signal never gets there: the launching process sweeps up after it
    (:func:`remove_deepspeed_shm_buffers`)."""
    try:
        os.unlink(deepspeed_shm_buffer(rank))
    except FileNotFoundError:
        return False
    return True


def remove_deepspeed_shm_buffers(port: int, ranks: Iterable[int]) -> list[str]:
    """Remove the DeepSpeed all-reduce buffers of ``ranks`` of the run on ``port`` (this user's; any
    MASTER_ADDR, since the launcher, not this process, chose the one the ranks saw) once every rank
    on this machine has exited; returns the removed paths. Called by the launching process after its
    ranks are gone, whatever their exit: a rank killed by a signal (OOM killer, ``kill -9``) never
    runs its own cleanup. Another run cannot own these names: while it runs it holds the port."""
    removed = []
    prefix = f"deepspeed_allreduce_buffer_{os.getuid()}_"
    wanted = {f"_{port}_{rank}" for rank in ranks}
    try:
        names = os.listdir(SHM_DIR)
    except OSError:  # no /dev/shm on this machine: DeepSpeed's CPU comm layer made no buffer either
        return removed
    for name in names:
        if name.startswith(prefix) and any(name.endswith(tail) for tail in wanted):
            path = os.path.join(SHM_DIR, name)
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            removed.append(path)
    return removed
