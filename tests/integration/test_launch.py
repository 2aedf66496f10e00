"""Launcher commands: multi-node torchrun needs each node's rank and node 0's address; the DeepSpeed
launcher's env file carries the project's settings to other nodes, parsed the way its runner parses it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from components.config import load_config
from components.errors import UserError
from components.runtime.launch import (
    DS_ENV_FILE_NAME,
    MODULE,
    forwarded_env,
    launcher_command,
    write_deepspeed_env,
)


def _cfg(*overrides: str):
    return load_config(overrides=list(overrides))


@pytest.fixture(autouse=True)
def _no_rendezvous_env(monkeypatch):
    for key in ("NODE_RANK", "MASTER_ADDR"):
        monkeypatch.delenv(key, raising=False)


def test_single_node_torchrun_needs_no_node_rank() -> None:
    cmd = launcher_command(_cfg("deepspeed.launcher=torchrun", "deepspeed.nproc_per_node=8"), ["--no-track"])
    assert "--nnodes=1" in cmd and "--nproc_per_node=8" in cmd and not any("node_rank" in a for a in cmd)
    assert cmd[-3:] == ["-m", MODULE, "--no-track"]


def test_multi_node_torchrun_without_node_rank_or_master_addr_is_refused(monkeypatch) -> None:
    cfg = _cfg("deepspeed.launcher=torchrun", "deepspeed.num_nodes=2")
    with pytest.raises(UserError, match=r"NODE_RANK=<0..1>.*missing: NODE_RANK, MASTER_ADDR"):
        launcher_command(cfg, [])
    monkeypatch.setenv("NODE_RANK", "1")
    with pytest.raises(UserError, match="missing: MASTER_ADDR"):
        launcher_command(cfg, [])
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("NODE_RANK", "2")
    with pytest.raises(UserError, match=r"NODE_RANK='2' must be an integer in 0..1"):
        launcher_command(cfg, [])


def test_multi_node_torchrun_command_names_node_rank_and_rendezvous(monkeypatch) -> None:
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    cmd = launcher_command(_cfg("deepspeed.launcher=torchrun", "deepspeed.num_nodes=2", "deepspeed.nproc_per_node=8",
                                "gspo.questions_per_step=16",
                                "deepspeed.master_port=29555"), ["--resume"])
    for arg in ("--nnodes=2", "--nproc_per_node=8", "--node_rank=1", "--master_addr=10.0.0.1",
                "--master_port=29555"):
        assert arg in cmd, arg
    assert cmd[-3:] == ["-m", MODULE, "--resume"]


def test_deepspeed_launcher_multi_node_needs_a_hostfile(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("deepspeed")
    with pytest.raises(UserError, match="deepspeed.hostfile"):
        launcher_command(_cfg("deepspeed.launcher=deepspeed", "deepspeed.num_nodes=2"), [])
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-0 slots=8\nnode-1 slots=8\n")
    cfg = _cfg("deepspeed.launcher=deepspeed", "deepspeed.num_nodes=2", f"deepspeed.hostfile={hostfile}")
    cmd = launcher_command(cfg, [])
    assert f"--hostfile={hostfile}" in cmd and "--num_nodes=2" in cmd and not any("master_addr" in a for a in cmd)
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    assert "--master_addr=10.0.0.1" in launcher_command(cfg, [])


def test_forwarded_env_selects_the_project_settings() -> None:
    env = {"AGENT_GSPO_PROFILE": "smoke", "AGENT_GSPO_PARAMS": "/shared/params.yaml", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false",
           "MLFLOW_TRACKING_URI": "http://mlflow:5000", "TORCH_EXTENSIONS_DIR": "/shared/ext",
           "NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "4", "DS_ACCELERATOR": "cuda",
           "CUDA_VISIBLE_DEVICES": "0", "DS_ENV_FILE": "/tmp/x", "PATH": "/usr/bin", "HOME": "/root",
           "SECRET_TOKEN": "x"}
    out = forwarded_env(env)
    assert set(out) == {"AGENT_GSPO_PROFILE", "AGENT_GSPO_PARAMS", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                        "DO_NOT_TRACK", "TOKENIZERS_PARALLELISM", "MLFLOW_TRACKING_URI", "TORCH_EXTENSIONS_DIR",
                        "NCCL_DEBUG", "OMP_NUM_THREADS", "DS_ACCELERATOR"}
    assert out["AGENT_GSPO_PROFILE"] == "smoke"
    with pytest.raises(UserError, match="AGENT_GSPO_PROFILE"):
        forwarded_env({"AGENT_GSPO_PROFILE": "a$b"})


def _exports_as_runner_reads(path: Path) -> dict[str, str]:
    """What DeepSpeed's runner does with an env file: split each line at '=', ``add_export`` it."""
    from deepspeed.launcher.multinode_runner import PDSHRunner

    runner = PDSHRunner(SimpleNamespace(user_script="x", user_args=[]), "e30=")
    with open(path) as fd:
        for line in fd.readlines():
            key, val = line.split("=", maxsplit=1)
            runner.add_export(key, val)
    return runner.exports


def test_deepspeed_env_file_round_trips_through_the_runner(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("deepspeed")
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    (work / DS_ENV_FILE_NAME).write_text("NCCL_SOCKET_IFNAME=eth1\nAGENT_GSPO_PROFILE=mine\n")
    env = {"AGENT_GSPO_PROFILE": "smoke", "HF_HUB_OFFLINE": "1", "MLFLOW_TRACKING_URI": "http://mlflow:5000/x?a=b",
           "AGENT_GSPO_DATA_MIRROR": "/data/bench marks"}
    path = write_deepspeed_env(tmp_path / "env", env)
    exports = _exports_as_runner_reads(path)
    assert exports["HF_HUB_OFFLINE"] == "1" and exports["MLFLOW_TRACKING_URI"] == '"http://mlflow:5000/x?a=b"'
    assert exports["AGENT_GSPO_DATA_MIRROR"] == '"/data/bench marks"'  # quoted by the runner for the shell
    assert exports["NCCL_SOCKET_IFNAME"] == "eth1"
    assert exports["AGENT_GSPO_PROFILE"] == "mine"  # the user's own .deepspeed_env still wins


@pytest.mark.parametrize("rc", [0, -9])
def test_launcher_removes_buffers_its_killed_ranks_left(tmp_path, monkeypatch, capsys, rc) -> None:
    """A rank killed by a signal never runs its shutdown: after the launch the parent removes that
    run's buffers (this uid, its port, this node's ranks, any address) and nothing else."""
    import os

    from components.runtime import launch
    from components.runtime import shm_buffers as d

    monkeypatch.setattr(d, "SHM_DIR", str(tmp_path))
    uid = os.getuid()
    ours = [tmp_path / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_29617_{r}" for r in (0, 1)]
    kept = [tmp_path / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_29618_0",  # another run's port
            tmp_path / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_229617_0",  # a port that ends like ours
            tmp_path / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_29617_12",  # a rank not on this node
            tmp_path / f"deepspeed_allreduce_buffer_{uid + 1}_127.0.0.1_29617_0",  # another user's
            tmp_path / "unrelated_29617_0"]
    cfg = _cfg("deepspeed.launcher=torchrun", "deepspeed.nproc_per_node=2", "deepspeed.master_port=29617")

    def fake_ranks(cmd, **kw) -> int:  # the ranks created their buffers, then one was killed
        for f in (*ours, *kept):
            f.write_bytes(b"x")
        return rc

    monkeypatch.setattr(launch, "run_streaming", fake_ranks)
    assert launch.launch_training(cfg, []) == rc
    assert not any(f.exists() for f in ours) and all(f.exists() for f in kept)
    assert capsys.readouterr().err.count("left by a rank that did not shut down") == 2


def test_local_ranks_of_each_launch(monkeypatch) -> None:
    from components.runtime.launch import local_ranks

    def ranks(*sets: str) -> list[int]:
        return list(local_ranks(_cfg(*sets)))

    assert ranks("deepspeed.launcher=none") == []
    assert ranks("deepspeed.launcher=torchrun", "deepspeed.nproc_per_node=4") == [0, 1, 2, 3]
    assert ranks("deepspeed.launcher=deepspeed", "deepspeed.nproc_per_node=2") == [0, 1]
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    assert ranks("deepspeed.launcher=torchrun", "deepspeed.nproc_per_node=2", "deepspeed.num_nodes=2") == [2, 3]
    assert ranks("deepspeed.launcher=deepspeed", "deepspeed.num_nodes=2", "deepspeed.hostfile=hosts") == []


def test_an_interrupted_launch_stops_its_child_first(tmp_path):
    """Ctrl-C / SIGTERM in the launching process reaches the training child: it is terminated and
    waited for (its last lines still shown) before the interrupt propagates, never left running."""
    import subprocess
    import sys

    from components.runtime.launch import run_streaming

    marker = tmp_path / "child-ended"
    child = ("import signal, sys, time\n"
             f"def bye(*a):\n    print('child: stopping', flush=True)\n    open({str(marker)!r}, 'w').close()\n"
             "    sys.exit(143)\n"
             "signal.signal(signal.SIGTERM, bye)\nprint('child: started', flush=True)\ntime.sleep(120)\n")
    seen = []

    def on_line(line: str) -> None:
        seen.append(line)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_streaming([sys.executable, "-c", child], on_line=on_line)
    assert seen == ["child: started"] and marker.exists()
    assert subprocess.run(["pgrep", "-f", str(marker)], capture_output=True).stdout == b""


def test_a_line_the_handler_showed_is_not_echoed_again(capsys) -> None:
    """`agent-gspo run`: the train task logs step lines (Prefect prints them); echoing them too doubled them."""
    import sys

    from components.runtime.launch import run_streaming

    seen: list[str] = []

    def on_line(line: str) -> bool:
        seen.append(line)
        return line.startswith("step ")

    child = "print('step 1/2 reward 0.5'); print('loading model'); print('step 2/2 reward 0.6')"
    assert run_streaming([sys.executable, "-c", child], on_line=on_line) == 0
    assert seen == ["step 1/2 reward 0.5", "loading model", "step 2/2 reward 0.6"]
    assert capsys.readouterr().out == "loading model\n"


@pytest.mark.parametrize(("content", "expected"), [
    ("localhost slots=abc\n", ":1: 'localhost slots=abc' is not `<host> slots=<GPUs>`"),
    ("garbage line here\n", ":1: 'garbage line here' is not"),
    ("# nodes\n\nnode1 slots=8\nnode1 slots=8\n", ":4: host 'node1' is listed twice"),
    ("", "lists 0 host(s), deepspeed.num_nodes is 1"),
    ("node1 slots=8  # the first\n", None),
])
def test_a_hostfile_deepspeed_would_reject_is_refused_before_the_launch(tmp_path, monkeypatch, content,
                                                                         expected) -> None:
    """Was: DeepSpeed's ValueError traceback from the launched process, then our TrainingFailed traceback
    with a --resume hint for a run that never wrote a checkpoint (and two Prefect retries)."""
    from components.runtime import launch

    hostfile = tmp_path / "hostfile"
    hostfile.write_text(content)
    monkeypatch.setattr(launch, "run_streaming", lambda *a, **k: 0)
    monkeypatch.setattr(launch.shutil, "which", lambda name: f"/usr/bin/{name}")
    cfg = _cfg("deepspeed.launcher=deepspeed", f"deepspeed.hostfile={hostfile}", "deepspeed.master_port=29731")
    if expected is None:
        assert launch.launch_training(cfg, []) == 0
        return
    with pytest.raises(UserError, match="deepspeed.hostfile: " + str(hostfile).replace(".", r"\.")) as err:
        launch.launch_training(cfg, [])
    assert expected in str(err.value)


def test_a_master_port_in_use_is_refused_before_the_launch(monkeypatch) -> None:
    import socket

    from components.runtime import launch

    monkeypatch.setattr(launch, "run_streaming", lambda *a, **k: pytest.fail("launched"))
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        cfg = _cfg("deepspeed.launcher=torchrun", "deepspeed.nproc_per_node=2", f"deepspeed.master_port={port}")
        with pytest.raises(UserError, match=f"deepspeed.master_port {port} is in use on this host"):
            launch.launch_training(cfg, [])


def test_a_failed_launch_is_one_line_and_names_resume_only_with_a_checkpoint(tmp_path, monkeypatch, capsys) -> None:
    from components.cli import main
    from components.runtime import launch

    monkeypatch.setattr(launch, "run_streaming", lambda *a, **k: 1)
    rc = main(["train", "--set", "deepspeed.launcher=torchrun", "--set", "deepspeed.master_port=29733",
               "--out", str(tmp_path / "run"), "--no-track"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err, err
    assert "training exited with code 1; no checkpoint was written" in err and "--resume" not in err


def test_torchrun_runs_through_the_quiet_entry_and_ranks_leave_the_interrupt_line_to_us() -> None:
    import sys

    from components.errors import PARENT_REPORTS_INTERRUPT
    from components.runtime.launch import TORCHRUN_MODULE, launch_env

    cmd = launcher_command(_cfg("deepspeed.launcher=torchrun", "deepspeed.nproc_per_node=2"), [])
    assert cmd[:3] == [sys.executable, "-m", TORCHRUN_MODULE]
    assert launch_env()[PARENT_REPORTS_INTERRUPT] == "1"


def test_torchrun_acts_on_the_first_death_signal_only(monkeypatch) -> None:
    """The SIGTERM our CLI sends after Ctrl-C must not raise inside torchrun's worker shutdown."""
    import signal

    from torch.distributed.elastic.multiprocessing import api

    from components.runtime import torchrun_entry

    monkeypatch.setattr(api, "_terminate_process_handler", api._terminate_process_handler)
    assert torchrun_entry.handle_first_signal_only() and torchrun_entry.handle_first_signal_only()
    handler = api._terminate_process_handler
    with pytest.raises(api.SignalException) as first:
        handler(signal.SIGINT, None)
    assert first.value.sigval == signal.SIGINT
    assert handler(signal.SIGTERM, None) is None  # the shutdown the first one started goes on


def test_a_launched_rank_exits_130_or_143_without_its_own_line(monkeypatch, capsys) -> None:
    from components.errors import PARENT_REPORTS_INTERRUPT, Terminated, run_command

    def interrupted() -> int:
        raise KeyboardInterrupt

    def terminated() -> int:
        raise Terminated

    assert run_command("agent-gspo train", interrupted) == 130
    assert capsys.readouterr().err == "agent-gspo train: interrupted (SIGINT)\n"
    monkeypatch.setenv(PARENT_REPORTS_INTERRUPT, "1")
    assert run_command("agent-gspo train", interrupted) == 130
    assert run_command("agent-gspo train", terminated) == 143
    assert capsys.readouterr().err == ""


def test_a_port_left_in_time_wait_by_the_run_just_stopped_is_not_in_use(monkeypatch) -> None:
    """The rendezvous store binds with SO_REUSEADDR, so TIME_WAIT connections do not stop it; the
    check must agree (was: `--resume` right after Ctrl-C refused with "in use" for ~60 s)."""
    import socket

    from components.runtime import launch

    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the store's side closes first: its port is left in TIME_WAIT
        client.close()
    with socket.socket() as plain:  # what the check used to do
        with pytest.raises(OSError):
            plain.bind(("", port))
    launch.check_master_port(_cfg("deepspeed.launcher=torchrun", "deepspeed.nproc_per_node=2",
                                  f"deepspeed.master_port={port}"))
