"""The import-layer contract of docs/architecture.md ("Layers"), as pyproject.toml states it for
import-linter: every import points down, the library never imports Prefect or ``flows/``, no
circle between the modules of one package, and no exception listed. import-linter sees imports
inside function bodies too, so moving an import into a function does not hide it.

The last three tests add one offending import to the project's real graph and check that the
contract then breaks: the contract can fail, and names what it catches."""

from __future__ import annotations

import copy
import importlib.util
import tomllib
from pathlib import Path

import grimp
import pytest
from helpers.paths import REPO_ROOT
from importlinter.api import read_configuration
from importlinter.application.use_cases import lint_imports
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.layers import LayersContract

ROOT = REPO_ROOT
PYPROJECT = ROOT / "pyproject.toml"
TYPES = {"layers": LayersContract, "forbidden": ForbiddenContract, "acyclic_siblings": AcyclicSiblingsContract}


@pytest.fixture(scope="module")
def config() -> dict:
    return read_configuration(str(PYPROJECT))


@pytest.fixture(scope="module")
def graph(config) -> grimp.ImportGraph:
    spec = importlib.util.find_spec("components")
    assert spec and spec.origin and Path(spec.origin).resolve().is_relative_to(ROOT), \
        f"components is imported from {spec and spec.origin}, not from this checkout {ROOT}"
    opts = config["session_options"]
    return grimp.build_graph(*opts["root_packages"], include_external_packages=True, cache_dir=None)


def broken(config: dict, graph: grimp.ImportGraph) -> list[str]:
    """The ids of the contracts that ``graph`` breaks."""
    out = []
    for options in config["contracts_options"]:
        contract = TYPES[options["type"]](options["name"], config["session_options"], options)
        if not contract.check(copy.deepcopy(graph), verbose=False).kept:
            out.append(options["id"])
    return out


def with_import(graph: grimp.ImportGraph, importer: str, imported: str) -> grimp.ImportGraph:
    changed = copy.deepcopy(graph)
    changed.add_import(importer=importer, imported=imported, line_number=1, line_contents=f"import {imported}")
    return changed


def test_the_project_keeps_every_contract() -> None:
    """What ``lint-imports`` checks, through its Python API (the command line's own entry point
    would reconfigure logging and disable the loggers later tests capture)."""
    assert lint_imports(config_filename=str(PYPROJECT), cache_dir=None, no_logo=True) is True


def test_no_exception_is_listed_and_the_five_contracts_are_there() -> None:
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    assert {c["id"] for c in contracts} == {"layers", "library", "study", "study_layers", "acyclic"}
    for c in contracts:
        assert not c.get("ignore_imports"), f"contract {c['id']} lists exceptions: {c['ignore_imports']}"
    layers = next(c for c in contracts if c["id"] == "layers")["layers"]
    assert layers[:2] == ["components.cli", "flows"], "the two entry points head the layers"
    assert "components.evaluation | components.gspo | components.search" in layers


def test_the_real_graph_keeps_them(config, graph) -> None:
    assert broken(config, graph) == []


@pytest.mark.parametrize("importer, imported", [
    ("components.evaluation.runner", "components.gspo.trainer"),  # siblings (the old load_train_items import)
    ("components.gspo.trainer", "components.runtime.engines"),  # the algorithm reaching into the runtime
    ("components.tracking.recorded", "components.evaluation.setting"),  # a lower layer reaching up
    ("components.mas.records", "components.reward.reward"),      # the old records <-> reward circle
    ("components.io", "components.config"),                      # a core module reaching up
])
def test_an_import_that_runs_up_breaks_the_layers(config, graph, importer, imported) -> None:
    assert "layers" in broken(config, with_import(graph, importer, imported))


@pytest.mark.parametrize("imported", ["prefect", "flows.pipeline"])
def test_the_library_importing_prefect_or_flows_breaks_it(config, graph, imported) -> None:
    if imported not in graph.modules:
        graph = copy.deepcopy(graph)
        graph.add_module(imported, is_squashed=True)
    assert "library" in broken(config, with_import(graph, "components.jobs.train", imported))


def test_a_circle_inside_one_package_breaks_it(config, graph) -> None:
    """flows.pipeline imports flows.logs; the reverse closes a circle that only ``acyclic`` sees (the
    study's results -> proof -> definitions -> results was one such circle)."""
    assert broken(config, with_import(graph, "flows.logs", "flows.pipeline")) == ["acyclic"]


@pytest.mark.parametrize("importer", ["components.jobs.train", "components.config", "flows.pipeline"])
def test_the_product_importing_the_study_breaks_it(config, graph, importer) -> None:
    assert "study" in broken(config, with_import(graph, importer, "experiments.report"))


def test_an_import_that_runs_up_inside_the_study_breaks_its_layers(config, graph) -> None:
    assert broken(config, with_import(graph, "experiments.results", "experiments.proof")) == ["study_layers",
                                                                                              "acyclic"]


def test_docs_architecture_lists_the_layers_the_contract_states() -> None:
    """docs/architecture.md's "Layers" block names the same layers in the same order."""
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["id"] == "layers")["layers"]
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## Layers", 1)[1].split("```", 2)[1].strip().splitlines()
    assert [line.split("  ")[0].strip() for line in block] == layers
