"""YAML reading that remembers where each key was written, for errors that name the line."""
from __future__ import annotations

from pathlib import Path

import yaml

from simserve.errors import ConfigError


class Located(dict):
    """A mapping that knows the line of each key (1-based) and of itself."""

    line: int = 0

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.key_lines: dict = {}


class LocatedList(list):
    line: int = 0


def _construct(node, path: str):
    if isinstance(node, yaml.MappingNode):
        out = Located()
        out.line = node.start_mark.line + 1
        out.key_lines = {}
        for knode, vnode in node.value:
            key = _scalar(knode)
            if key in out:
                raise ConfigError(f"{path}:{knode.start_mark.line + 1}: duplicate key {key!r}")
            out[key] = _construct(vnode, path)
            out.key_lines[key] = knode.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        out = LocatedList(_construct(v, path) for v in node.value)
        out.line = node.start_mark.line + 1
        return out
    return _scalar(node)


_LOADER = yaml.SafeLoader("")


def _scalar(node):
    return _LOADER.construct_object(node, deep=True)


def load_located(path: str | Path):
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    if node is None:
        raise ConfigError(f"{p}: the file is empty")
    return _construct(node, str(p))


def line_of(obj, key=None) -> int | None:
    if key is not None and isinstance(obj, Located):
        return obj.key_lines.get(key, obj.line)
    return getattr(obj, "line", None) or None
