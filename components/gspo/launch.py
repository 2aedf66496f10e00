"""Start training in-process or under a distributed launcher, streaming its output.

``deepspeed.launcher`` in params.yaml picks how: ``none`` runs :func:`components.gspo.job.train`
in this process; ``torchrun`` and ``deepspeed`` spawn ``components.gspo.train_main`` on every
rank (``nproc_per_node`` per node, ``num_nodes`` nodes, a hostfile for multi-node DeepSpeed).
The CLI, the Prefect training task and the DVC stage all come through here, so one flow drives
a CPU process, one GPU or many nodes alike.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from components.config import Config
from components.errors import UserError

MODULE = "components.gspo.train_main"


def forwarded_args(args: Any, *, resume: bool, max_steps: int | None, out_dir: str | None) -> list[str]:
    """The training flags of one CLI invocation, re-emitted for every rank."""
    out: list[str] = []
    if getattr(args, "params", None):
        out += ["--params", str(args.params)]
    if getattr(args, "profile", None):
        out += ["--profile", str(args.profile)]
    for item in getattr(args, "overrides", []) or []:
        out += ["--set", item]
    if resume:
        out.append("--resume")
    if max_steps is not None:
        out += ["--max-steps", str(max_steps)]
    if out_dir:
        out += ["--out", str(out_dir)]
    if getattr(args, "no_track", False):
        out.append("--no-track")
    return out


def launcher_command(cfg: Config, train_args: Sequence[str]) -> list[str]:
    """argv of the distributed launch for ``cfg.deepspeed`` (``torchrun`` or ``deepspeed``)."""
    ds = cfg.deepspeed
    if ds.launcher == "torchrun":
        exe = shutil.which("torchrun")
        base = [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]
        cmd = base + [f"--nnodes={ds.num_nodes}", f"--nproc_per_node={ds.nproc_per_node}",
                      f"--master_port={ds.master_port}"]
        if ds.num_nodes > 1:
            cmd += ["--rdzv_backend=c10d", f"--rdzv_endpoint={os.environ.get('MASTER_ADDR', '127.0.0.1')}:"
                    f"{ds.master_port}"]
        return cmd + ["-m", MODULE, *train_args]
    if ds.launcher == "deepspeed":
        exe = shutil.which("deepspeed")
        if exe is None:
            raise UserError("deepspeed.launcher=deepspeed but the `deepspeed` launcher is not on PATH "
                            "(pip install deepspeed==0.19.8, see .ci/install)")
        cmd = [exe, f"--master_port={ds.master_port}"]
        if ds.hostfile:
            if not Path(ds.hostfile).is_file():
                raise UserError(f"deepspeed.hostfile: {ds.hostfile} not found")
            cmd += [f"--hostfile={ds.hostfile}", f"--num_nodes={ds.num_nodes}"]
        else:
            cmd += ["--num_nodes=1"]
        cmd += [f"--num_gpus={ds.nproc_per_node}", "--no_local_rank", "--module", MODULE, *train_args]
        return cmd
    raise UserError(f"deepspeed.launcher={ds.launcher!r} is not a launcher (allowed: none, torchrun, deepspeed)")


def launch_env() -> dict[str, str]:
    """Environment for launched ranks: CPU runs need DeepSpeed's CPU accelerator and no MPI discovery."""
    env = dict(os.environ)
    try:
        import torch

        if not torch.cuda.is_available():
            env.setdefault("DS_ACCELERATOR", "cpu")
    except ImportError:  # pragma: no cover - torch is a hard dependency
        pass
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_streaming(cmd: Sequence[str], *, env: dict[str, str] | None = None,
                  on_line: Callable[[str], None] | None = None) -> int:
    """Run ``cmd``, echo each output line (and hand it to ``on_line``), return the exit code."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        if on_line is not None:
            on_line(line.rstrip("\n"))
    return proc.wait()


def launch_training(cfg: Config, args: Any, *, resume: bool = False, max_steps: int | None = None,
                    out_dir: str | None = None, on_line: Callable[[str], None] | None = None) -> int:
    """Train as configured; returns the exit code (0 = success)."""
    if cfg.deepspeed.launcher == "none":
        from components.gspo.job import train

        train(cfg, resume=resume, max_steps=max_steps, out_dir=out_dir, track=not getattr(args, "no_track", False))
        return 0
    cmd = launcher_command(cfg, forwarded_args(args, resume=resume, max_steps=max_steps, out_dir=out_dir))
    print("launching: " + " ".join(cmd), file=sys.stderr)
    return run_streaming(cmd, env=launch_env(), on_line=on_line)
