"""Process-group helpers shared by the trainer, the engines and checkpoints.

Why these exist: the same training code runs as one plain process (tests, laptops), under
``torchrun`` and under the ``deepspeed`` launcher. Every helper below therefore degrades to the
obvious single-process answer when no process group exists (``all_gather_objects`` returns
``[obj]``, ``barrier`` does nothing), so callers never branch on "am I distributed?".

Decision on when a default process group is created:

* ``world_size > 1``: always (nccl on CUDA, gloo otherwise).
* ``world_size == 1`` and ``for_deepspeed=True``: yes, through
  ``deepspeed.init_distributed(dist_backend=..., auto_mpi_discovery=False)``. DeepSpeed's engine
  needs its communication backend even for one rank; with RANK/WORLD_SIZE/... set it never tries
  MPI discovery. On CPU the first call JIT-builds DeepSpeed's small ``shm_comm`` C++ op (minutes
  on 2 cores, once); :func:`ensure_torch_extensions_dir` points the build cache at
  ``~/.cache/agent-gspo/torch_extensions`` so later runs reuse it.
* ``world_size == 1`` otherwise: no group; plain torch needs none.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TypeVar

import torch
import torch.distributed as dist

from components.errors import UserError
from components.runtime.shm_buffers import unlink_deepspeed_shm_buffer

T = TypeVar("T")

DEFAULT_MASTER_PORT = 29500
TORCH_EXTENSIONS_DEFAULT = "~/.cache/agent-gspo/torch_extensions"


class DistributedError(UserError):
    """Inconsistent launcher environment (RANK/WORLD_SIZE/...) or bad sharding arguments."""


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job."""

    rank: int
    """global rank (0..world_size-1)"""
    world_size: int
    """number of processes in the job"""
    local_rank: int
    """rank on this node; selects the CUDA device"""
    is_main: bool
    """True on global rank 0 (the one that writes shared files and logs)"""

    @property
    def device(self) -> torch.device:
        """``cuda:<local_rank>`` when CUDA is available, else ``cpu``."""
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def all_gather(self, obj: T) -> list[T]:
        """Every rank's ``obj`` (picklable), indexed by rank; ``[obj]`` on one rank, with no collective
        (:class:`components.gspo.policy_engine.Ranks`)."""
        return all_gather_objects(obj) if self.world_size > 1 else [obj]


def free_port() -> int:
    """An unused TCP port on 127.0.0.1 (for single-process groups and tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ensure_torch_extensions_dir() -> str:
    """Set ``TORCH_EXTENSIONS_DIR`` (unless the user did) so DeepSpeed's JIT op build is cached."""
    path = os.path.expanduser(os.environ.get("TORCH_EXTENSIONS_DIR") or TORCH_EXTENSIONS_DEFAULT)
    os.makedirs(path, exist_ok=True)
    os.environ["TORCH_EXTENSIONS_DIR"] = path
    return path


def env_int(name: str) -> int:
    """The integer a launcher set in ``name``; a :class:`DistributedError` naming it otherwise."""
    raw = os.environ[name]
    try:
        return int(raw)
    except ValueError as exc:
        raise DistributedError(f"environment variable {name}={raw!r} is not an integer") from exc


def _set_env_defaults() -> None:
    """Fill RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT when a launcher did not.

    With WORLD_SIZE=1 and no MASTER_PORT we pick a free port instead of 29500: a lone process
    has no peer that must agree on the port, and parallel test runs on one machine would
    otherwise collide on the TCP store.
    """
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        single = os.environ["WORLD_SIZE"] == "1"
        os.environ["MASTER_PORT"] = str(free_port() if single else DEFAULT_MASTER_PORT)


def dist_info() -> DistInfo:
    """This process's position, from the live process group if any, else from the environment."""
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    return DistInfo(rank=rank, world_size=world, local_rank=local, is_main=rank == 0)


def init_distributed(backend: str | None = None, *, for_deepspeed: bool = False,
                     timeout_s: float = 1800.0) -> DistInfo:
    """Set the launcher env defaults and create the default process group when needed.

    Idempotent: a second call returns the current :class:`DistInfo`. ``backend`` defaults to
    ``nccl`` on CUDA and ``gloo`` otherwise. Raises :class:`DistributedError` when RANK or
    LOCAL_RANK do not fit WORLD_SIZE (a mis-set launcher), naming the variable.
    """
    _set_env_defaults()
    rank, world, local = env_int("RANK"), env_int("WORLD_SIZE"), env_int("LOCAL_RANK")
    if world < 1 or not 0 <= rank < world:
        raise DistributedError(f"RANK={rank} / WORLD_SIZE={world}: need 0 <= RANK < WORLD_SIZE")
    if local < 0:
        raise DistributedError(f"LOCAL_RANK={local} must be >= 0")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
    already = dist.is_available() and dist.is_initialized()
    if for_deepspeed:
        ensure_torch_extensions_dir()
        import deepspeed  # local import: the torch engine path must not need DeepSpeed

        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False,
                                   timeout=timedelta(seconds=timeout_s), verbose=False)
    elif world > 1 and not already:
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return dist_info()


def is_distributed() -> bool:
    """True when a default process group exists."""
    return dist.is_available() and dist.is_initialized()


def shutdown_distributed() -> None:
    """Destroy the default process group (always, at exit). Safe to call twice.

    No barrier first: after a failure on one rank a barrier would hang the others. When
    DeepSpeed's comm layer holds the group, its own ``destroy_process_group`` is used: it also
    drops DeepSpeed's cached sub-groups, without which a later ``deepspeed.initialize`` in the
    same process (tests, Optuna trials) would use destroyed groups. For gloo groups the call
    ends with :func:`_drain_gloo_workers`.
    """
    if not is_distributed():
        return
    gloo = dist.get_backend() == "gloo"
    ds_comm = sys.modules.get("deepspeed.comm.comm")
    if ds_comm is not None and getattr(ds_comm, "cdb", None) is not None:
        rank = dist.get_rank()
        ds_comm.destroy_process_group()
        unlink_deepspeed_shm_buffer(rank)
    else:
        dist.destroy_process_group()
    if gloo:
        _drain_gloo_workers()


GLOO_DRAIN_S = 0.25
"""How long :func:`_drain_gloo_workers` releases the GIL (seconds)."""


def _drain_gloo_workers(seconds: float = GLOO_DRAIN_S) -> None:
    """Let gloo's worker threads free the last collectives' tensors before the interpreter exits.

    Why: a gloo worker thread destroys each finished work object *after* the caller's ``wait()``
    has returned, and freeing a tensor that has a Python object needs the GIL. If the main
    thread reaches interpreter finalisation first, that thread cannot take the GIL any more and
    the process aborts with ``terminate called without an active exception`` (SIGABRT, exit
    -6) although training finished; torchrun then reports the whole job as failed. We saw it in
    about one run in six on a loaded 2-core machine (a gdb backtrace showed
    ``~AsyncAllgatherWork`` in ``ProcessGroupGloo::runLoop`` blocked in ``take_gil`` during
    ``Py_FinalizeEx``). ``destroy_process_group`` does not join those threads: modules imported
    while the group was alive (``torch._dynamo`` among them) keep references to it, so its
    destructor only runs during finalisation. Upstream has no fix (pytorch/pytorch#179291 was
    abandoned). A short sleep releases the GIL, so every pending destructor finishes while the
    interpreter is still alive.
    """
    time.sleep(seconds)


def barrier() -> None:
    """Wait for all ranks; no-op without a process group."""
    if is_distributed():
        dist.barrier()


def all_gather_objects(obj: T) -> list[T]:
    """Every rank's ``obj`` (picklable), indexed by rank. ``[obj]`` without a process group."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: T, src: int = 0) -> T:
    """``obj`` as held by rank ``src``, on every rank. Identity without a process group."""
    if not is_distributed():
        return obj
    box: list[Any] = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_reduce_mean(value: float) -> float:
    """Mean of a Python float over ranks (float64 on the collective's device)."""
    if not is_distributed():
        return float(value)
    device = torch.device("cuda", torch.cuda.current_device()) \
        if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item()) / dist.get_world_size()


def shard(items: Sequence[T], rank: int, world: int,
          strategy: Literal["contiguous", "strided"] = "contiguous") -> list[T]:
    """This rank's share of ``items``; the shares of ranks 0..world-1 partition ``items``.

    ``contiguous``: consecutive blocks whose sizes differ by at most one (earlier ranks get the
    extra item), so a rank's questions stay in input order. ``strided``: ``items[rank::world]``.
    Deterministic: depends only on the arguments.
    """
    if world < 1:
        raise DistributedError(f"shard: world={world} must be >= 1")
    if not 0 <= rank < world:
        raise DistributedError(f"shard: rank={rank} outside 0..{world - 1}")
    if strategy == "strided":
        return list(items[rank::world])
    if strategy != "contiguous":
        raise DistributedError(f"shard: unknown strategy {strategy!r} (allowed: contiguous, strided)")
    base, extra = divmod(len(items), world)
    start = rank * base + min(rank, extra)
    stop = start + base + (1 if rank < extra else 0)
    return list(items[start:stop])


class _NoCpuAcceleratorWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Setting accelerator to CPU")


def quiet_deepspeed_cpu_warning() -> None:
    """Drop DeepSpeed's "Setting accelerator to CPU ..." warning (printed on stdout, between step
    lines) in a run whose engine is torch: ``transformers``' ``save_pretrained`` imports DeepSpeed
    only to recognise a DeepSpeed-wrapped model (accelerate's ``extract_model_from_parallel``), and
    the warning then describes nothing this run uses. A filter, not a level: DeepSpeed's logger
    resets its level when it is imported."""
    logger = logging.getLogger("DeepSpeed")
    if not any(isinstance(f, _NoCpuAcceleratorWarning) for f in logger.filters):
        logger.addFilter(_NoCpuAcceleratorWarning())
