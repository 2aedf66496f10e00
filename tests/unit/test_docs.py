"""The README as a front door: short, its commands real and in an order that works, its links alive.

The used-by block itself runs end to end in ``tests/e2e/test_readme_used_by.py``; here only what needs
no process: the block's order, that the CLI parses each of its commands, and every relative link.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

from helpers.paths import REPO_ROOT
from helpers.readme import used_by_commands

from components.cli import build_parser

ROOT = REPO_ROOT
README = ROOT / "README.md"
MAX_README_LINES = 250

# Pages other engineers write in parallel: linked from the README before they exist on this branch.
# The integrator empties this set once they are merged (then every link must resolve).
PENDING_PAGES: set[str] = set()

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _markdown_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def _without_fences(text: str) -> str:
    return re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.S | re.M)


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans (links there are not links)."""
    return re.sub(r"`[^`\n]*`", "", _without_fences(text))


def relative_links(path: Path) -> list[tuple[str, Path]]:
    """(link as written, the file it points to) for every relative link of a Markdown file."""
    found = []
    for m in LINK.finditer(_prose(path.read_text())):
        target = m.group(1) or m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
            continue  # http(s)://, mailto:
        file = unquote(target.split("#", 1)[0])
        found.append((target, (path.parent / file).resolve() if file else path.resolve()))
    return found


def anchors(path: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    ids: set[str] = set()
    counts: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", _without_fences(path.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = counts.get(slug, 0)
        counts[slug] = n + 1
        ids.add(slug if n == 0 else f"{slug}-{n}")
    return ids


def test_link_finder_sees_links_and_skips_code_and_urls(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("[a](docs/x.md#h) ![img](results/p.png) [web](https://e.org) [same](#top)\n"
                    "`[not](code.md)`\n```\n[nor](fenced.md)\n```\n")
    assert [t for t, _ in relative_links(page)] == ["docs/x.md#h", "results/p.png", "#top"]
    assert relative_links(page)[0][1] == (tmp_path / "docs" / "x.md").resolve()
    page.write_text("# Used by: schedules, DVC\n## Run (`silence_proof`)\n## A\n## A\n```\n# not a heading\n```\n")
    assert anchors(page) == {"used-by-schedules-dvc", "run-silence_proof", "a", "a-1"}


def test_every_relative_link_in_readme_and_docs_points_to_an_existing_file() -> None:
    missing = []
    for page in _markdown_files():
        for target, path in relative_links(page):
            if path.relative_to(ROOT.resolve()).as_posix() in PENDING_PAGES:
                continue
            if not path.exists():
                missing.append(f"{page.relative_to(ROOT)}: {target}")
            elif "#" in target and path.suffix == ".md" and target.split("#", 1)[1] not in anchors(path):
                missing.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not missing, "links to files or headings that do not exist:\n" + "\n".join(missing)


def test_readme_links_every_docs_page() -> None:
    """Nothing moved out of the README is out of reach: every docs page is linked from it."""
    linked = {path for _, path in relative_links(README)}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"
    pending = {p for t, p in relative_links(README) if p.relative_to(ROOT.resolve()).as_posix() in PENDING_PAGES}
    assert len(pending) == len(PENDING_PAGES)


def test_readme_is_short_and_its_test_command_is_the_one_ci_runs() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines (at most {MAX_README_LINES})"
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip().startswith("python -m pytest")]
    assert len(ci) == 1 and any(line.startswith(ci[0] + " ") or line == ci[0] for line in lines), ci


def test_used_by_block_parses_and_promotes_only_evaluated_versions() -> None:
    """Each promoted version was evaluated before with the same options (the gate's setting is the one
    evaluate records under the same --profile/--set), and ``@champion`` is used only after a promote."""
    commands = used_by_commands(README.read_text())
    parser = build_parser()
    promoted = False
    for i, cmd in enumerate(commands):
        parser.parse_args(cmd[1:])  # an unknown subcommand or option exits 2 here
        if "@champion" in " ".join(cmd):
            assert promoted, f"{' '.join(cmd)!r} uses @champion before any promote"
        if cmd[1] == "promote":
            candidate = cmd[cmd.index("--candidate") + 1]
            options = [a for a in cmd[2:] if a not in ("--candidate", candidate)]
            evaluated = [c for c in commands[:i] if c[1] == "evaluate" and candidate in c]
            assert evaluated, f"{candidate} is promoted before it is evaluated"
            assert [a for a in evaluated[-1][2:] if a not in ("--model", candidate)] == options, (
                f"{candidate}: evaluate and promote must take the same --profile/--set")
            promoted = True
    assert promoted
