"""The README's used-by block: read by a fast order check (unit) and run end to end (e2e)."""

from __future__ import annotations

import re
import shlex

BEGIN, END = "<!-- used-by:begin -->", "<!-- used-by:end -->"


def used_by_commands(readme: str) -> list[list[str]]:
    """The ``agent-gspo`` commands of the block between the markers, comments dropped, as argument lists."""
    assert readme.count(BEGIN) == 1 and readme.count(END) == 1, f"README needs one {BEGIN} ... {END} block"
    block = readme.split(BEGIN, 1)[1].split(END, 1)[0]
    fence = re.search(r"```bash\n(.*?)```", block, re.S)
    assert fence, "the used-by block holds no ```bash fence"
    commands = [c for c in (shlex.split(line, comments=True) for line in fence.group(1).splitlines()) if c]
    assert commands and all(c[0] == "agent-gspo" for c in commands), commands
    return commands
