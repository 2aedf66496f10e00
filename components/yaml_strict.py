"""``yaml.safe_load`` without the two traps of a hand-edited params file.

- A repeated key: YAML keeps the last one without a word, so a second ``mas:`` section silently
  replaces the first and a setting the user can see in the file has no effect.
- Aliases (``*name``): they expand by reference, so a few lines can build a structure of 10⁹
  elements ("billion laughs") that hangs the loader and exhausts memory. A params file has no use
  for them (``profiles:`` already merges), so they are refused outright rather than counted.

PyYAML has no switch for either; the subclass below is the smallest hook into its loader.

It also reads ``1e-5`` as a float. PyYAML follows YAML 1.1, whose float needs a dot (``1.0e-5``),
so the exponent form people write for learning rates became the *string* ``"1e-5"``; the typed
schema refuses strings for numbers (a quoted ``'3'`` is a mistake to report, not to coerce), so
the YAML 1.2 spelling must arrive as a number. Likewise ``steps: 010`` is ten, not YAML 1.1's
octal 8, and ``1:30``, ``1_000`` and ``0b11`` are the strings they are in YAML 1.2 (1.1: 90, 1000, 3).
Booleans are YAML 1.2's too: ``true``/``false`` (any of three casings); 1.1's ``yes``, ``no``, ``on`` and
``off`` are strings, so ``model.name: off`` is the text it reads as, not ``False``, and ``must_answer: yes``
is reported (a bool setting takes ``true``) rather than read as a boolean the user did not write.
"""

from __future__ import annotations

import os
import re
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError

MAX_INT_DIGITS = 1000
"""longest integer a YAML file or ``--set`` value may spell (in decimal digits, or the same magnitude in
hex, octal): Python refuses to convert more than 4300 digits between text and int, so ``lr: 9...9``
(5000 nines) was a ValueError traceback in the loader, and ``0xff...f`` one in the error message or
``config show``; no setting is anywhere near this long"""

MAX_DEPTH = 64
"""deepest nesting of collections a params file may use (its deepest key is 4 levels): PyYAML composes
recursively, so ``[[[[...`` 5000 deep was a RecursionError traceback"""


class StrictSafeLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases, repeated mapping keys, merge keys and nesting deeper than
    :data:`MAX_DEPTH` (errors carry line and column), and reads integers as YAML 1.2 does."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: D102 - PyYAML hook
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ComposerError(None, None, f"found alias *{event.anchor}: aliases are not allowed here "
                                "(write the value out)", event.start_mark)
        if self._depth >= MAX_DEPTH:
            raise ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep",
                                self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: Any) -> Any:  # noqa: D102 - PyYAML hook
        """YAML 1.2 integers where 1.1 differs: ``010`` is ten (1.1: octal 8); ``1:30``, ``1_000`` and
        ``0b11`` are strings (1.1: 90, 1000, 3), so that the schema reports them instead of a silent number."""
        value = self.construct_scalar(node)
        if ":" in value or "_" in value or value.lstrip("+-").startswith("0b"):  # 1.1 only: strings in 1.2
            return value
        digits = value.lstrip("+-")
        if len(digits) > MAX_INT_DIGITS and digits.isdigit():  # refused before int() (which would raise)
            raise ConstructorError(None, None, f"an integer of {len(digits)} digits (at most {MAX_INT_DIGITS})",
                                   node.start_mark)
        if len(digits) > 1 and digits[0] == "0" and digits.isdigit():
            return int(value, 10)
        number = super().construct_yaml_int(node)
        if abs(number) >= 10**MAX_INT_DIGITS:  # 0x / 0o spellings: int() reads them, str() cannot print them
            raise ConstructorError(None, None, f"an integer of more than {MAX_INT_DIGITS} digits", node.start_mark)
        return number

    def construct_yaml_float(self, node: Any) -> Any:  # noqa: D102 - PyYAML hook
        value = self.construct_scalar(node)
        if ":" in value or "_" in value:  # 1.1 sexagesimal and digit separators: strings in 1.2
            return value
        return super().construct_yaml_float(node)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:  # noqa: D102 - PyYAML hook
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise ConstructorError(None, None, "found a merge key (<<): not allowed here (write the keys "
                                           "out; profiles: already merge onto the base)", key_node.start_mark)
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                if first is not None:
                    raise ConstructorError(None, None, f"duplicate key {key!r} (first on line {first + 1})",
                                           key_node.start_mark)
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


# YAML 1.2 exponent floats that 1.1 misses: no dot (1e-5, -2E+3) or an unsigned exponent (2.5e5, .5e3)
StrictSafeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"))


# YAML 1.2 booleans: drop 1.1's bool resolver (yes/no/on/off) and put the 1.2 one in its place
StrictSafeLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in StrictSafeLoader.yaml_implicit_resolvers.items()}
StrictSafeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))

StrictSafeLoader.add_constructor("tag:yaml.org,2002:int", StrictSafeLoader.construct_yaml_int)
StrictSafeLoader.add_constructor("tag:yaml.org,2002:float", StrictSafeLoader.construct_yaml_float)


MAX_FILE_BYTES = 1 << 20
"""largest YAML file read (params.yaml is ~20 KB): ``--params /dev/zero`` read until the kernel's OOM
killer stopped it at 17 GB, taking whatever else ran on the machine at risk"""


class FileTooLarge(ValueError):
    """A YAML file over :data:`MAX_FILE_BYTES` (or an endless device)."""


def read_capped_text(path: str | os.PathLike[str], limit: int = MAX_FILE_BYTES) -> str:
    """``path``'s UTF-8 text, reading at most ``limit`` + 1 bytes: raises :class:`FileTooLarge` beyond
    ``limit`` (``/dev/zero`` included), ``UnicodeDecodeError`` and ``OSError`` as ``read_text`` would.
    Pipes stay readable (``--params <(...)``)."""
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(f"larger than {limit // 1024} KiB")
    return data.decode("utf-8")


def strict_load(text: str) -> Any:
    """Parse YAML ``text`` like ``yaml.safe_load``; raises ``yaml.YAMLError`` on an alias or a repeated key."""
    return yaml.load(text, Loader=StrictSafeLoader)  # noqa: S506 - a SafeLoader subclass


def one_line(exc: yaml.YAMLError) -> str:
    """PyYAML's multi-line message (problem, context, a caret under the line) as one line."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem
