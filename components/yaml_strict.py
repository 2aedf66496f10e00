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
the YAML 1.2 spelling must arrive as a number.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError


class StrictSafeLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and repeated mapping keys (errors carry line and column)."""

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: D102 - PyYAML hook
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ComposerError(None, None, f"found alias *{event.anchor}: aliases are not allowed here "
                                "(write the value out)", event.start_mark)
        return super().compose_node(parent, index)

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


def strict_load(text: str) -> Any:
    """Parse YAML ``text`` like ``yaml.safe_load``; raises ``yaml.YAMLError`` on an alias or a repeated key."""
    return yaml.load(text, Loader=StrictSafeLoader)  # noqa: S506 - a SafeLoader subclass
