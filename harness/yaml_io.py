"""Reading YAML the one way the harness reads it: safely, strictly, with errors that say where.

Every config the harness reads (a run file, a study file, a ``--set`` value) goes through
:func:`parse_yaml`. It differs from ``yaml.safe_load`` in three ways:

- a key repeated in one mapping is an error (``safe_load`` silently keeps the last value);
- numbers in exponent notation without a dot (``1e-3``, ``1e9``) are floats, as in YAML 1.2
  and JSON (YAML 1.1 reads them as strings);
- errors are :class:`~harness.errors.ConfigError` naming the source, line and column.

Files are read as UTF-8 (a byte-order mark is allowed); other bytes are a clean error. No tag
that builds a Python object is understood: a config is data, never code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from harness.errors import ConfigError

#: YAML 1.2 / JSON floats, including ``1e9`` and ``-2.5E-3`` (YAML 1.1 needs a dot).
_FLOAT = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""", re.X)


class StrictLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses duplicate keys and reads ``1e9`` as a float."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: let SafeLoader report it
                continue
            if first is not key_node:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found the key {key!r} twice (first at line {first.start_mark.line + 1}); "
                    f"a key may appear once in a mapping", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


# Replace YAML 1.1's float rule with one that also reads exponent notation without a dot.
StrictLoader.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in rules if tag != "tag:yaml.org,2002:float"]
    for ch, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


#: a config is a few kilobytes: larger text, or data that expands (through YAML aliases) to
#: more values than this, is refused before it is parsed or validated (a YAML bomb expands to
#: billions of values; 200,000 keys take the parser tens of seconds)
MAX_TEXT_BYTES = 256 * 1024
MAX_VALUES = 100_000


def parse_yaml(text: str, source: str) -> Any:
    """The data of a YAML document; a :class:`ConfigError` naming ``source`` otherwise."""
    if len(text) > MAX_TEXT_BYTES:
        raise ConfigError(f"{source} is {len(text):,} characters long; a config is at most "
                          f"{MAX_TEXT_BYTES:,} (is it the right file?).")
    try:
        data = yaml.load(text, Loader=StrictLoader)  # noqa: S506  (a SafeLoader subclass)
        if _expands_beyond(data, MAX_VALUES):
            raise ConfigError(f"{source} expands to more than {MAX_VALUES:,} values (YAML aliases "
                              f"repeat a value each time they are used: an alias bomb?); a config "
                              f"is far smaller. Write the values out, or shorten the lists.")
        return data
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{source} is not valid YAML{where}: {problem}.") from None
    except RecursionError:
        raise ConfigError(f"{source} is nested too deeply to be a config.") from None


def _expands_beyond(data: Any, budget: int) -> bool:
    """Whether ``data`` holds more than ``budget`` values once aliases are expanded (counted
    without expanding them: a shared list counts each time it is reached, and the walk stops
    as soon as the budget is spent)."""
    left = budget
    stack = [data]
    while stack:
        node = stack.pop()
        left -= 1
        if left < 0:
            return True
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def read_text(path: str | os.PathLike[str], what: str = "config file") -> str:
    """A file's text, decoded as UTF-8; a clean error if it is missing or not UTF-8."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{what} {p} does not exist. Pass the path of a YAML file.")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {p}: {exc.strerror}.") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{p} is not UTF-8 text (byte {data[exc.start]:#04x} at line {line}). Save the file "
            f"as UTF-8."
        ) from None


def read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A YAML file whose top level is a mapping (a run or study config)."""
    data = parse_yaml(read_text(path), str(path)) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must contain a mapping at the top level, not {type(data).__name__}.")
    return data


def parse_value(raw: str, where: str) -> Any:
    """The value of a ``--set key=value`` override, read as YAML (``[1, 2]``, ``{a: 1}``, ``3``)."""
    return parse_yaml(raw, where) if raw else None
