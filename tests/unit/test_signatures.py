"""Signatures carry objects, not lists of loose values (issue 50): no function of the library or the
study takes more than six parameters (positional and keyword-only, ``self``/``cls`` not counted;
dataclass records' generated constructors are not written functions, so they do not count)."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers.paths import REPO_ROOT

ROOT = REPO_ROOT
LIMIT = 6


def _count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    return len(names) - (1 if names and names[0] in ("self", "cls") else 0)


def test_no_function_takes_more_than_six_parameters() -> None:
    long = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({_count(node)})"
            for package in ("components", "experiments") for path in sorted((ROOT / package).rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _count(node) > LIMIT]
    assert not long, f"functions with more than {LIMIT} parameters (take the config section or a record): {long}"


def test_the_count_sees_a_long_signature(tmp_path: Path) -> None:
    fn = ast.parse("def f(self, a, b, c, *, d, e, f, g): pass").body[0]
    assert isinstance(fn, ast.FunctionDef) and _count(fn) == 7
