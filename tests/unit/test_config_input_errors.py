"""Hostile and careless input to the params file, --set and CLI options: always one message naming
what is wrong and where, exit 2, never a traceback, a hang, or a silently ignored setting."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

from components.cli import main
from components.config import ConfigError, load_config

ROOT = REPO_ROOT
CUSTOM = ["mas.topology=custom", "mas.agents=2"]


def _file(tmp_path: Path, name: str, content: bytes | str) -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


@pytest.mark.parametrize(("content", "expected"), [
    ("mas:\n  agents: 3\n  agents: 99\n", r"line 3, column 3: duplicate key 'agents' \(first on line 2\)"),
    ("mas: {agents: 3}\nreward: {}\nmas: {rounds: 2}\n", r"duplicate key 'mas' \(first on line 1\)"),
    ("a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n", r"found alias \*a"),
    (b"mas:\n  agents: \xff\n", r"not UTF-8 text \(byte offset 15\)"),
    ("- mas\n- reward\n", "top level must be a mapping"),
    ("profile: smoke\n", "'profile' is not a section"),
    ("profiles:\n  smoke: 5\n", r"profiles.smoke must be a mapping of sections \(got 5\)"),
])
def test_params_file_traps_are_refused_by_name(tmp_path, content, expected):
    path = _file(tmp_path, "p.yaml", content)
    start = time.monotonic()
    with pytest.raises(ConfigError, match=expected) as err:
        load_config(path, "smoke" if b"smoke" in path.read_bytes() else None)
    assert str(err.value).startswith(str(path)) and time.monotonic() - start < 5  # aliases never expand


def test_a_named_params_file_must_exist_but_the_implicit_default_may_not(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_config().gspo.steps == 200  # no params.yaml here: the schema defaults
    for named in (tmp_path / "missing.yaml", tmp_path):
        with pytest.raises(ConfigError, match=f"{named}: (params file not found|cannot read the params file)"):
            load_config(named)
    monkeypatch.setenv("AGENT_GSPO_PARAMS", str(tmp_path / "env.yaml"))
    with pytest.raises(ConfigError, match="env.yaml: params file not found"):
        load_config()


def test_unknown_profile_lists_each_name_once(tmp_path):
    path = _file(tmp_path, "p.yaml", "profiles:\n  default: {}\n  smoke: {}\n")
    with pytest.raises(ConfigError, match=r"unknown profile 'nope' \(allowed: default, smoke\)$"):
        load_config(path, "nope")
    with pytest.raises(ConfigError, match="empty profile name"):
        load_config(path, " ")


@pytest.mark.parametrize(("override", "expected"), [
    ("=3", "empty name in the key path"),
    ("mas..agents=3", "empty name in the key path 'mas..agents'"),
    ("profile=smoke", "profile is not a setting"),
    ("profiles.smoke.mas={}", "profiles is not a setting"),
    ("data.benchmarks=[&a x, *a]", r"found alias \*a"),
    ("budget.target=.inf", "budget.target: Input should be a finite number"),
    ("reward.token_norm=.inf", "reward.token_norm: Input should be a finite number"),
    # `inf` without the dot is a YAML string: refused as a string, not coerced to a float
    ("reward.token_norm=inf", r"reward.token_norm: Input should be a valid number \(got 'inf'\)"),
    ("gspo.seed=18446744073709551616", "gspo.seed: Input should be less than or equal to 4294967295"),
    ("eval.seed=-1", "eval.seed: Input should be greater than or equal to 0"),
    ("model.name=' '", "model.name: String should match pattern"),
    ("gspo.out_dir=''", "gspo.out_dir: String should have at least 1 character"),
    ("data.benchmarks=[]", "data.benchmarks: List should have at least 1 item"),
    ("data.train_sources=[]", "data.train_sources: List should have at least 1 item"),
    ("data.train_sources=[nope/x]", "'nope/x' must be 'benchmark/split'"),
    ("data.train_sources=[gsm8k]", "'gsm8k' must be 'benchmark/split'"),
    ("eval.benchmarks=[nope]", r"eval.benchmarks.0: Input should be 'mmlu'"),
    ("mas.adjacency=[[1]]", "mas.adjacency is read only with topology 'custom'"),
    ("deepspeed.hostfile=hosts.txt", "deepspeed.hostfile is read only with deepspeed.launcher=deepspeed"),
    # launcher none is one process: the other ranks would never be started
    ("deepspeed.nproc_per_node=4", r"deepspeed.nproc_per_node=4 is read only with a launcher \(deepspeed.launcher "
                                   r"is 'none'.*\): set deepspeed.launcher=torchrun or deepspeed.launcher=deepspeed, "
                                   r"or deepspeed.nproc_per_node=1$"),
    ("deepspeed.num_nodes=2", r"deepspeed.num_nodes=2 is read only with a launcher .* or deepspeed.num_nodes=1$"),
])
def test_overrides_that_would_be_ignored_or_crash_later_are_refused(override, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(ROOT / "params.yaml", None, [override])


@pytest.mark.parametrize(("overrides", "expected"), [
    (["budget.enabled=false", "budget.fraction=0.5"],
     r"budget.fraction=0.5 is read only with budget.enabled=true \(with the budget off no B is calibrated or "
     r"tracked\): set budget.enabled=true or budget.fraction=null$"),
    (["deepspeed.num_nodes=2", "deepspeed.nproc_per_node=8"],
     r"deepspeed.nproc_per_node=8 and deepspeed.num_nodes=2 are read only with a launcher .*: set "
     r"deepspeed.launcher=torchrun or deepspeed.launcher=deepspeed, or deepspeed.nproc_per_node=1 and "
     r"deepspeed.num_nodes=1$"),
])
def test_a_setting_whose_switch_is_off_is_refused_naming_both_keys(overrides, expected, capsys, monkeypatch):
    """Were silently ignored: no B calibrated with the budget off; one process with launcher none."""
    with pytest.raises(ConfigError, match=expected):
        load_config(ROOT / "params.yaml", None, overrides)
    monkeypatch.chdir(ROOT)
    argv = ["validate", "--params", str(ROOT / "params.yaml")]
    assert main([*argv, *(a for o in overrides for a in ("--set", o))]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and overrides[-1].split("=")[0] in err and "read only with" in err, err


@pytest.mark.parametrize(("profile", "overrides"), [
    (None, ["budget.fraction=0.5"]),  # the budget on: B = fraction x the untrained policy's tokens
    (None, ["deepspeed.launcher=torchrun", "deepspeed.num_nodes=2", "deepspeed.nproc_per_node=2"]),
    # a profile's budget.mode / lr / kp / lambda_max left in place when an experiment turns the budget off
    ("results", ["reward.lambda_tok=0", "budget.enabled=false", "reward.lambda_turn=0", "reward.lambda_rep=0"]),
])
def test_the_allowed_neighbours_of_the_refused_combinations_load(profile, overrides):
    cfg = load_config(ROOT / "params.yaml", profile, overrides)
    assert cfg.flat()[overrides[-1].split("=")[0]] is not None


def test_budget_bounds_and_custom_adjacency_values_are_checked():
    with pytest.raises(ConfigError, match=r"budget.lambda_min=5.0 is above budget.lambda_max=1.0$"):
        load_config(ROOT / "params.yaml", None, ["budget.lambda_min=5", "budget.lambda_max=1"])
    with pytest.raises(ConfigError, match=r"mas.adjacency must hold only 0 and 1 \(found \[-1, 7\]\)"):
        load_config(ROOT / "params.yaml", None, [*CUSTOM, "mas.adjacency=[[0,7],[-1,0]]"])
    cfg = load_config(ROOT / "params.yaml", None, [*CUSTOM, "mas.adjacency=[[0,1],[1,0]]"])
    assert cfg.mas.adjacency == [[0, 1], [1, 0]]


@pytest.mark.parametrize("argv", [
    ["search", "--budget-tokens", "-5"],
    ["rollout", "--benchmark", "gsm8k", "--agents", "17"],
    ["prepare", "--benchmarks", ","],
    ["evaluate", "--baselines", "oracle"],
])
def test_cli_options_outside_the_schema_exit_2_with_one_message(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "error:" in err, err


@pytest.mark.parametrize(("override", "expected"), [
    ("mas.agents=true", r"mas.agents: Input should be a valid integer \(got True\)"),
    ("gspo.steps='30'", r"gspo.steps: Input should be a valid integer \(got '30'\)"),
    ("gspo.steps=30.5", r"gspo.steps: Input should be a valid integer \(got 30.5\)"),
    ("gspo.steps=30.0", r"gspo.steps: Input should be a valid integer \(got 30.0\)"),
    ("gspo.lr='2e-5'", r"gspo.lr: Input should be a valid number \(got '2e-5'\)"),
    ("data.use_hub=1", r"data.use_hub: Input should be a valid boolean \(got 1\)"),
    ("data.use_hub=yes_please", r"data.use_hub: Input should be a valid boolean \(got 'yes_please'\)"),
    ("mas.topology=1", r"mas.topology: Input should be 'complete'"),
])
def test_values_of_the_wrong_type_are_refused_not_coerced(override, expected):
    """Lax pydantic read `agents: true` as 1 agent and a quoted '30' as 30 steps without a word."""
    with pytest.raises(ConfigError, match=expected):
        load_config(ROOT / "params.yaml", overrides=[override])


def test_exponent_floats_without_a_dot_are_numbers_in_the_file_and_in_set(tmp_path):
    """YAML 1.1 (PyYAML) reads `1e-5` as a string; the strict schema would then refuse the most
    common way to write a learning rate. The loader reads the YAML 1.2 form as a float."""
    path = _file(tmp_path, "p.yaml",
                 "gspo:\n  lr: 3e-5\n  eps_low: 2E-2\n  steps: 4\nbudget:\n  lr: +1e-1\n  target: 1.5e2\n")
    cfg = load_config(path)
    got = (cfg.gspo.lr, cfg.gspo.eps_low, cfg.budget.lr, cfg.budget.target, cfg.gspo.steps)
    assert got == (3e-5, 0.02, 0.1, 150.0, 4)
    cfg = load_config(path, overrides=["gspo.lr=1e-3", "reward.lambda_tok=0"])
    assert isinstance(cfg.reward.lambda_tok, float) and cfg.reward.lambda_tok == 0.0
    with pytest.raises(ConfigError, match=r"gspo.lr: Input should be greater than 0"):
        load_config(path, overrides=["gspo.lr=-1e-3"])
    assert load_config(path, overrides=["data.mirror=1e5x"]).data.mirror == "1e5x"  # not a number: a string


@pytest.mark.parametrize(("argv", "expected"), [
    # all of rollout's episodes are one batch: --group-size 100000 took the machine's 24 GB (OOM-killed)
    (["rollout", "--benchmark", "gsm8k", "--limit", "1", "--group-size", "100000"], "at most 256"),
    (["rollout", "--benchmark", "gsm8k", "--seed", "99999999999999999999999"], "must be in 0..4294967295"),
    (["rollout", "--benchmark", "gsm8k", "--json", "{afile}/x.jsonl"], "{afile}: exists and is not a folder"),
    (["rollout", "--benchmark", "gsm8k", "--json", "{adir}"], "is a folder, not a file"),
    (["evaluate", "--metrics", "{afile}/m"], "(--metrics) {afile}/m: {afile} exists and is not a folder"),
    (["evaluate", "--metrics", "{afile}"], "metrics folder (--metrics) {afile}: is a file, not a folder"),
    (["train", "--metrics", "{adir}"], "metrics file (--metrics) {adir}: is a folder"),
    (["evaluate", "--out", "{adir}", "--metrics", "{adir}/metrics"], "inside the evaluation folder"),
])
def test_output_paths_and_sizes_are_refused_before_any_work(argv, expected, capsys, tmp_path, monkeypatch):
    """Were: an OOM kill, an int64 overflow traceback, or a FileExistsError / IsADirectoryError traceback after
    the whole evaluation had run (and been recorded in MLflow)."""
    import components.models as models

    monkeypatch.setattr(models, "load_policy", lambda *a, **k: pytest.fail("the model was loaded"))
    afile, adir = tmp_path / "afile", tmp_path / "adir"
    afile.write_text("x")
    adir.mkdir()
    (adir / "summary.json").write_text("{}")
    argv = [a.format(afile=afile, adir=adir) for a in argv]
    try:
        code = main([*argv, "--params", str(ROOT / "params.yaml")])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and expected.format(afile=afile, adir=adir) in err, err
    assert (adir / "summary.json").read_text() == "{}"


def test_deep_nesting_in_a_params_file_is_one_line_not_a_recursion_error(tmp_path: Path, capsys) -> None:
    path = _file(tmp_path, "deep.yaml", "data:\n  out_dir: " + "[" * 5000 + "]" * 5000 + "\n")
    assert main(["validate", "--params", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: not valid YAML: line 2" in err and "nested more than 64 levels deep" in err, err
    assert "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize("override", ["data.out_dir=" + "[" * 3000 + "]" * 3000,
                                      ".".join(["a"] * 5000) + "=1"])
def test_a_monstrous_override_is_one_line(override: str, capsys) -> None:
    assert main(["validate", "--params", str(ROOT / "params.yaml"), "--set", override]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and "override" in err, err[:300]


@pytest.mark.parametrize(("overrides", "named"), [(["train.steps=1"], ["train: unknown key"]),
                                                  (["gspo.lr=abc"], ["gspo.lr: "]),
                                                  (["gspo.lr=abc", "gspo.seed=x"],
                                                   ["\n  gspo.lr: ", "\n  gspo.seed: "])])
def test_one_bad_key_is_one_line_and_several_are_one_line_each(overrides: list[str], named: list[str], capsys) -> None:
    """Was: ``...: invalid configuration`` on one line and the key on a second, for a single bad key."""
    assert main(["validate", "--params", str(ROOT / "params.yaml"), *(a for o in overrides for a in ("--set", o))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == (1 if len(overrides) == 1 else 1 + len(overrides)) and "Traceback" not in err, err
    assert all(n in err for n in named) and ("invalid configuration: " in err) == (len(overrides) == 1), err


def test_integers_follow_yaml_1_2_not_1_1(tmp_path: Path) -> None:
    """Was: `steps: 010` read as octal 8 and `1:30` as the sexagesimal 90, without a word."""
    path = _file(tmp_path, "p.yaml", "gspo:\n  steps: 010\n")
    assert load_config(path).gspo.steps == 10
    with pytest.raises(ConfigError, match="search.budget_seconds: Input should be a valid number .*'1:30'"):
        load_config(path, overrides=["search.budget_seconds=1:30"])
    for spelling in ("1_000", "0b11", "1_0.5"):
        with pytest.raises(ConfigError, match=f"gspo.steps: Input should be a valid integer .*'{spelling}'"):
            load_config(path, overrides=[f"gspo.steps={spelling}"])
    assert load_config(path, overrides=["gspo.seed=0777", "gspo.lr=1e-5"]).gspo.seed == 777


def test_booleans_follow_yaml_1_2_not_1_1(tmp_path: Path) -> None:
    """Was: `must_answer: yes` read as True and `model.name: off` as False ("Input should be a valid string
    (got False)" for a value the user typed as text), YAML 1.1's Norway problem."""
    path = _file(tmp_path, "p.yaml", "mas:\n  must_answer: TRUE\ndata:\n  use_hub: False\n")
    cfg = load_config(path)
    assert cfg.mas.must_answer is True and cfg.data.use_hub is False
    for word in ("yes", "no", "on", "off", "Yes", "OFF"):
        with pytest.raises(ConfigError, match=rf"mas.must_answer: Input should be a valid boolean \(booleans are "
                                              rf"true or false, as in YAML 1.2\) \(got '{word}'\)"):
            load_config(path, overrides=[f"mas.must_answer={word}"])
    assert load_config(path, overrides=["model.name=off"]).model.name == "off"
    assert load_config(path, overrides=["data.mirror=no"]).data.mirror == "no"
    with pytest.raises(ConfigError, match="booleans are true or false"):
        load_config(_file(tmp_path, "q.yaml", "data:\n  use_hub: on\n"))


@pytest.mark.parametrize("source", ["/dev/zero", "big"])
def test_an_endless_or_huge_params_file_is_one_line_not_an_oom_kill(source: str, tmp_path: Path, capsys) -> None:
    """Was: `--params /dev/zero` read until the kernel's OOM killer stopped it at 17 GB of memory."""
    path = Path(source) if source.startswith("/") else _file(tmp_path, "big.yaml", "# " + "x" * (2 << 20) + "\n")
    assert main(["validate", "--params", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: larger than 1024 KiB" in err and "Traceback" not in err and err.count("\n") == 1, err


def test_a_params_file_read_from_a_pipe_still_works(tmp_path: Path) -> None:
    """`--params <(...)` hands the command a pipe: the size cap must not refuse it."""
    import threading

    read_fd, write_fd = os.pipe()
    text = (ROOT / "params.yaml").read_bytes()
    writer = threading.Thread(target=lambda: (os.write(write_fd, text), os.close(write_fd)))
    writer.start()
    try:
        cfg = load_config(f"/dev/fd/{read_fd}")
    finally:
        writer.join()
        os.close(read_fd)
    assert cfg.mas.agents == load_config(ROOT / "params.yaml").mas.agents


def test_an_empty_mirror_or_option_is_refused(capsys) -> None:
    """Was: `data.mirror: ""` meant "no mirror" (the hub on a networked machine) and `--mirror ""` the default."""
    with pytest.raises(ConfigError, match="data.mirror: String should have at least 1 character"):
        load_config(ROOT / "params.yaml", overrides=['data.mirror=""'])
    assert main(["prepare", "--mirror", " "]) == 2
    assert "agent-gspo prepare: error: --mirror: empty path or name" in capsys.readouterr().err


@pytest.mark.parametrize(("override", "key"), [("mas.max_message_tokens=1000000000", "mas.max_message_tokens"),
                                               ("gspo.group_size=100000", "gspo.group_size"),
                                               ("gspo.questions_per_step=100000", "gspo.questions_per_step")])
def test_sizes_that_would_exhaust_memory_are_refused_at_load(override: str, key: str) -> None:
    """Was: accepted, then a 24 GB allocation traceback in the decoder after the model loaded."""
    with pytest.raises(ConfigError, match=f"{key}: Input should be less than or equal to"):
        load_config(ROOT / "params.yaml", overrides=[override])
