"""Errors meant for users: the CLI prints the message and exits non-zero, without a traceback."""
from __future__ import annotations

from difflib import get_close_matches


class SimserveError(Exception):
    """A problem with the user's input (config, trace, name); the message says where."""


class ConfigError(SimserveError):
    pass


class TraceFormatError(SimserveError):
    pass


def did_you_mean(name: str, known) -> str:
    hint = get_close_matches(str(name), [str(k) for k in known], n=1)
    return f" (did you mean {hint[0]!r}?)" if hint else ""
