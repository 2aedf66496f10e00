"""`agent-gspo config keys` lists every --set key (from the schema); `config show` resolves a profile."""

from __future__ import annotations

import yaml

from components.cli import main
from components.config_doc import NAME, schema_keys


def _leaves(value, prefix=""):
    if isinstance(value, dict) and value:
        for k, v in value.items():
            key = f"{prefix}{k}"
            if prefix == "experiments.definitions.":
                key = f"{prefix}{NAME}"
            yield from _leaves(v, key + ".")
    else:
        yield prefix.rstrip(".")


def test_every_leaf_of_the_resolved_config_is_listed_with_type_default_and_description(capsys) -> None:
    assert main(["config", "show", "--profile", "results"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert main(["config", "keys", "--profile", "results"]) == 0
    listing = capsys.readouterr().out.splitlines()
    listed = {line.split()[0]: line for line in listing[1:]}
    leaves = set(_leaves(shown))
    assert len(leaves) > 100
    missing = sorted(k for k in leaves if k not in listed and not k.startswith("experiments."))
    assert not missing, f"keys of the resolved config missing from `config keys`: {missing}"
    assert "experiments" in listed  # one opaque key: the study lists its own (`python -m experiments keys`)
    for key in ("gspo.eps_low", "budget.target", "mas.agents"):
        assert " default " in listed[key] and len(listed[key].split("default", 1)[1].split()) >= 2


def test_every_schema_key_has_a_description() -> None:
    assert [d.key for d in schema_keys() if not d.description] == []


def test_show_reflects_the_profile_and_the_overrides(capsys) -> None:
    assert main(["config", "show", "--profile", "smoke", "--set", "gspo.lr=3e-6"]) == 0
    smoke = yaml.safe_load(capsys.readouterr().out)
    assert main(["config", "show"]) == 0
    default = yaml.safe_load(capsys.readouterr().out)
    assert smoke["profile"] == "smoke" and smoke["gspo"]["steps"] == 3 and smoke["gspo"]["out_dir"] == "runs/smoke"
    assert smoke["gspo"]["lr"] == 3e-6
    assert default["gspo"]["steps"] != 3 and default["profile"] == "default"
    assert main(["config", "keys", "--profile", "smoke", "--section", "gspo"]) == 0
    assert any(line.startswith("gspo.steps ") and "default 3 " in line for line in capsys.readouterr().out.splitlines())


def test_unknown_section_is_a_one_line_error(capsys) -> None:
    assert main(["config", "keys", "--section", "nope"]) == 2
    err = capsys.readouterr().err
    assert "--section 'nope'" in err and "gspo" in err
