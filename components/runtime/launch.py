"""Commands that start training in a new process or under a distributed launcher, streaming its output.

``deepspeed.launcher`` in params.yaml picks how: ``none`` runs ``python -m
components.runtime.train_main`` (or :func:`components.runtime.training_run.train` in the caller's process, see
:class:`components.jobs.TrainJob`); ``torchrun`` and ``deepspeed`` spawn it on every rank
(``nproc_per_node`` per node, ``num_nodes`` nodes). The CLI, the Prefect training task and the
DVC stage all run the training job, which comes through here, so one flow drives a CPU process,
one GPU or many nodes.

Multi-node, the two launchers differ in who starts the other nodes:

* ``torchrun`` starts processes on its own node only. Run the same ``agent-gspo train`` command
  on every node, with ``NODE_RANK`` (0..num_nodes-1) and ``MASTER_ADDR`` (an address of node 0
  that every node reaches) in its environment; :func:`launcher_command` refuses a multi-node
  torchrun without them, since a default of 127.0.0.1 would leave every node waiting for itself.
* ``deepspeed`` with ``deepspeed.hostfile`` starts every node itself, over pdsh/ssh from node 0.
  A remote shell gets only what the DeepSpeed runner exports (``PYTHON*``, ``MLFLOW*``, ...), so
  :func:`launch_training` writes the project's variables (``AGENT_GSPO_*``, the offline defaults
  of :mod:`components.env`, Hugging Face / torch / NCCL / DeepSpeed settings) to an env file and
  points the runner at it with ``DS_ENV_FILE`` (the runner's ``.deepspeed_env`` mechanism).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from components.config import Config
from components.env import OFFLINE_DEFAULTS
from components.errors import PARENT_REPORTS_INTERRUPT, UserError
from components.redact import redact
from components.runtime import orphans
from components.runtime.shm_buffers import remove_deepspeed_shm_buffers
from components.runtime.training_dtype import check_training_dtype_setting

MODULE = "components.runtime.train_main"
TORCHRUN_MODULE = "components.runtime.torchrun_entry"
"""torchrun with a quiet interrupt (the launcher for ``deepspeed.launcher=torchrun``)"""
DS_ENV_FILE_NAME = ".deepspeed_env"
"""the file name the DeepSpeed runner reads from ``~`` and the working directory"""
FORWARD_PREFIXES = ("AGENT_GSPO_", "HF_", "TRANSFORMERS_", "MLFLOW_", "PREFECT_", "DVC_", "TORCH_", "NCCL_",
                    "DS_", "PYTORCH_")
FORWARD_NAMES = frozenset(OFFLINE_DEFAULTS) | {"OMP_NUM_THREADS", "TORCHINDUCTOR_CACHE_DIR"}
NOT_FORWARDED = frozenset({"DS_ENV_FILE", "CUDA_VISIBLE_DEVICES"})
"""set per node by the DeepSpeed launcher itself (or naming this very file)"""
_UNSAFE_VALUE = re.compile(r'["$`\\\n]')


def _node_rank(num_nodes: int) -> int:
    raw = os.environ.get("NODE_RANK")
    if raw is None or not os.environ.get("MASTER_ADDR"):
        raise UserError(
            f"deepspeed.num_nodes={num_nodes} with deepspeed.launcher=torchrun: run the same command on every "
            f"node with NODE_RANK=<0..{num_nodes - 1}> and MASTER_ADDR=<address of node 0 that all nodes reach> "
            f"set (missing: {', '.join(k for k in ('NODE_RANK', 'MASTER_ADDR') if not os.environ.get(k))}), or "
            f"use deepspeed.launcher=deepspeed with deepspeed.hostfile, which starts every node itself")
    try:
        rank = int(raw)
    except ValueError:
        rank = -1
    if not 0 <= rank < num_nodes:
        raise UserError(f"NODE_RANK={raw!r} must be an integer in 0..{num_nodes - 1} (deepspeed.num_nodes={num_nodes})")
    return rank


def hosts_rank_zero(cfg: Config) -> bool:
    """Whether the launch started on this machine includes global rank 0, the rank that writes the
    final model and prints its summary line: False only on nodes 1.. of a multi-node torchrun run
    (one command per node); the DeepSpeed launcher runs on node 0 and starts the others."""
    ds = cfg.deepspeed
    return not (ds.launcher == "torchrun" and ds.num_nodes > 1 and _node_rank(ds.num_nodes) != 0)


def launcher_command(cfg: Config, train_args: Sequence[str]) -> list[str]:
    """argv of the distributed launch for ``cfg.deepspeed`` (``torchrun`` or ``deepspeed``).

    Multi-node torchrun reads ``NODE_RANK`` and ``MASTER_ADDR`` from the environment (see the
    module docstring); the DeepSpeed launcher takes ``MASTER_ADDR`` when set, else it asks the
    first host of the hostfile over ssh.
    """
    ds = cfg.deepspeed
    if ds.launcher == "torchrun":
        # torchrun itself, minus the traceback an interrupt ends it with (see torchrun_entry.py)
        cmd = [sys.executable, "-m", TORCHRUN_MODULE, f"--nnodes={ds.num_nodes}",
               f"--nproc_per_node={ds.nproc_per_node}"]
        if ds.num_nodes > 1:
            # static rendezvous on node 0: each node says which it is, node 0's agent hosts the store
            cmd += [f"--node_rank={_node_rank(ds.num_nodes)}", f"--master_addr={os.environ['MASTER_ADDR']}",
                    f"--master_port={ds.master_port}", "--max_restarts=0"]
        else:
            cmd += [f"--master_port={ds.master_port}"]
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
            if os.environ.get("MASTER_ADDR"):
                cmd += [f"--master_addr={os.environ['MASTER_ADDR']}"]
        elif ds.num_nodes > 1:
            raise UserError(f"deepspeed.num_nodes={ds.num_nodes} with deepspeed.launcher=deepspeed needs "
                            f"deepspeed.hostfile (one `<host> slots=<GPUs>` line per node, see infra/deepspeed)")
        else:
            cmd += ["--num_nodes=1"]
        cmd += [f"--num_gpus={ds.nproc_per_node}", "--no_local_rank", "--module", MODULE, *train_args]
        return cmd
    raise UserError(f"deepspeed.launcher={ds.launcher!r} is not a launcher (allowed: none, torchrun, deepspeed)")


def forwarded_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that ranks on other nodes need (see the module docstring)."""
    out: dict[str, str] = {}
    for key in sorted(env):
        if key in NOT_FORWARDED or not (key in FORWARD_NAMES or key.startswith(FORWARD_PREFIXES)):
            continue
        value = env[key]
        if _UNSAFE_VALUE.search(value):
            raise UserError(f"environment variable {key}={value!r} cannot be forwarded to other nodes by the "
                            f"DeepSpeed launcher (it writes `export {key}=\"...\"` into a remote shell): remove "
                            f"quotes, $, backquotes, backslashes and newlines from it, or unset it")
        out[key] = value
    return out


def _user_deepspeed_env_files(env: Mapping[str, str]) -> list[Path]:
    """Env files the DeepSpeed runner would read on its own (``~`` first, then the working dir)."""
    name = env.get("DS_ENV_FILE", DS_ENV_FILE_NAME)
    files = [Path(os.path.expanduser("~")) / name, Path.cwd() / name]
    seen: list[Path] = []
    for f in files:
        if f.is_file() and f.resolve() not in [s.resolve() for s in seen]:
            seen.append(f)
    return seen


def write_deepspeed_env(path: str | Path, env: Mapping[str, str]) -> Path:
    """Write the DeepSpeed runner's env file: :func:`forwarded_env`, then the user's own env files.

    The runner reads ``KEY=VALUE`` lines and later lines win, so a user's ``~/.deepspeed_env`` or
    ``./.deepspeed_env`` (which ``DS_ENV_FILE`` would otherwise hide) still overrides ours.
    """
    lines = [f"{k}={v}" for k, v in forwarded_env(env).items()]
    for extra in _user_deepspeed_env_files(env):
        lines += [ln for ln in extra.read_text().splitlines() if "=" in ln]
    path = Path(path)
    path.write_text("".join(f"{ln}\n" for ln in lines))  # no blank line: the runner splits every line at '='
    return path


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
    env[PARENT_REPORTS_INTERRUPT] = "1"  # ranks interrupted with us exit quietly: we print the one line
    return env


LineHandler = Callable[[str], bool | None]
"""gets each output line of a launched training; returns True when it showed the line itself (a Prefect
task's logger prints it on the terminal too), so that it is not echoed a second time"""


def run_streaming(cmd: Sequence[str], *, env: dict[str, str] | None = None,
                  on_line: LineHandler | None = None) -> int:
    """Run ``cmd``, hand each output line to ``on_line`` and echo it unless ``on_line`` returned
    True (it showed the line already); return the exit code.

    Interrupted here (Ctrl-C, or SIGTERM unwound by :func:`components.errors.run_command`), the
    child gets SIGTERM too and is waited for (killed after :data:`STOP_WAIT_S`) before this
    unwinds: a training left running would keep its folder's lock (so the ``--resume`` that
    follows is refused), and its MLflow run would end FAILED instead of KILLED. Its descendants
    too: they are reparented to this process once the launcher exits, and waited for
    (:mod:`components.runtime.orphans`)."""
    env, token = orphans.launch_env(env)
    with orphans.reaping(STOP_WAIT_S, token) as known:  # the launch's processes reparented to us are waited for
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, bufsize=1)
        known.add(proc.pid)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                shown = on_line(line.rstrip("\n")) if on_line is not None else False
                if not shown:
                    sys.stdout.write(line)
            return proc.wait()
        except BaseException:
            stop_child(proc)
            raise


def _drain(stream: IO[str]) -> None:
    with contextlib.suppress(OSError, ValueError):  # closed under us: nothing left to show
        for line in stream:
            sys.stdout.write(line)


STOP_WAIT_S = 60.0
"""how long an interrupted child may take to unwind (write nothing half, end its MLflow run)"""


def stop_child(proc: subprocess.Popen, wait_s: float = STOP_WAIT_S) -> int | None:
    """SIGTERM ``proc`` (a launcher forwards it to its ranks), wait up to ``wait_s``, then SIGKILL."""
    if proc.poll() is not None:
        return proc.returncode
    proc.terminate()
    if proc.stdout is not None:  # keep reading, or a child writing its last lines blocks on a full pipe
        threading.Thread(target=_drain, args=(proc.stdout,), daemon=True).start()
    try:
        return proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def training_command(cfg: Config, train_args: Sequence[str]) -> list[str]:
    """argv that trains as configured in a new process: ``python -m`` :data:`MODULE` for
    ``deepspeed.launcher=none``, else the distributed launcher (:func:`launcher_command`)."""
    if cfg.deepspeed.launcher == "none":
        return [sys.executable, "-m", MODULE, *train_args]
    return launcher_command(cfg, train_args)


HOSTFILE_LINE = re.compile(r"^(?P<host>\S+)\s+slots=(?P<slots>[1-9][0-9]*)$")
"""one node of a DeepSpeed hostfile: ``<host> slots=<GPUs>`` (blank lines and ``#`` comments allowed)"""


def check_hostfile(path: str | Path, num_nodes: int) -> list[str]:
    """The hosts of a DeepSpeed hostfile; :class:`UserError` naming file and line for a line the
    DeepSpeed launcher would reject (with its traceback, after the launch started), or fewer hosts
    than ``deepspeed.num_nodes``."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"deepspeed.hostfile: {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") \
            from None
    hosts = []
    for n, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        match = HOSTFILE_LINE.match(text)
        if match is None:
            raise UserError(f"deepspeed.hostfile: {path}:{n}: {line.strip()!r} is not `<host> slots=<GPUs>`")
        if match["host"] in hosts:
            raise UserError(f"deepspeed.hostfile: {path}:{n}: host {match['host']!r} is listed twice")
        hosts.append(match["host"])
    if len(hosts) < num_nodes:
        raise UserError(f"deepspeed.hostfile: {path} lists {len(hosts)} host(s), deepspeed.num_nodes is {num_nodes}")
    return hosts


def check_master_port(cfg: Config) -> None:
    """:class:`UserError` when this host is to hold the rendezvous and ``deepspeed.master_port`` is
    taken: the launcher would fail with a DistNetworkError traceback (after 48 s under DeepSpeed)."""
    ds = cfg.deepspeed
    hosts_store = (ds.launcher == "torchrun" and (ds.num_nodes == 1 or os.environ.get("NODE_RANK") == "0")) or (
        ds.launcher == "deepspeed" and not ds.hostfile)
    if not hosts_store:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # as the rendezvous store binds: a port that only holds TIME_WAIT connections of the run
        # just stopped is free for it (without this, a `--resume` right after Ctrl-C was refused
        # for a minute); a socket listening on it still fails the bind
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", ds.master_port))
        except OSError as exc:
            raise UserError(f"deepspeed.master_port {ds.master_port} is in use on this host ({exc.strerror}); "
                            "choose another with --set deepspeed.master_port=N") from None


def launch_training(cfg: Config, train_args: Sequence[str], *, on_line: LineHandler | None = None) -> int:
    """Train in a new process (:func:`training_command`) with ``train_args`` (the flags of
    ``components.runtime.train_main``) and stream its output; returns the exit code (0 = success)."""
    check_training_dtype_setting(cfg.model.dtype)  # before any rank starts
    if cfg.deepspeed.launcher == "deepspeed" and cfg.deepspeed.hostfile and Path(cfg.deepspeed.hostfile).is_file():
        check_hostfile(cfg.deepspeed.hostfile, cfg.deepspeed.num_nodes)
    check_master_port(cfg)
    cmd = training_command(cfg, train_args)
    env = launch_env()
    print("launching: " + redact(" ".join(cmd)), file=sys.stderr)
    try:
        if cfg.deepspeed.launcher != "deepspeed" or not cfg.deepspeed.hostfile:
            return run_streaming(cmd, env=env, on_line=on_line)
        with tempfile.TemporaryDirectory(prefix="agent-gspo-launch-") as tmp:
            # from the user's environment, not launch_env(): its CPU-only defaults (DS_ACCELERATOR=cpu when
            # this host has no GPU) describe the launching host, not the nodes of the hostfile
            env["DS_ENV_FILE"] = str(write_deepspeed_env(Path(tmp) / DS_ENV_FILE_NAME, os.environ))
            return run_streaming(cmd, env=env, on_line=on_line)
    finally:
        ranks = local_ranks(cfg)
        if ranks:  # what a rank killed by a signal left in /dev/shm (the others removed their own)
            for path in remove_deepspeed_shm_buffers(cfg.deepspeed.master_port, ranks):
                print(f"removed {path} (left by a rank that did not shut down)", file=sys.stderr)


def local_ranks(cfg: Config) -> range:
    """Global ranks a launch from this machine runs here: all of them on one node, node k's slice of
    a multi-node torchrun run; none known for the DeepSpeed launcher over a hostfile (it starts
    every node itself, over ssh) or without a distributed launcher."""
    ds = cfg.deepspeed
    if ds.launcher == "none" or (ds.launcher == "deepspeed" and ds.hostfile):
        return range(0)
    node = _node_rank(ds.num_nodes) if ds.num_nodes > 1 else 0
    return range(node * ds.nproc_per_node, (node + 1) * ds.nproc_per_node)
