# Stand-in for xgrammar (the real wheel is ~45 MB). SGLang touches it only for structured
# outputs and tool-call grammars, which the device plan never requests; `StructuralTag` is a
# typing alias so that pydantic models naming it still build, any other name is an empty class.
from typing import Any

__version__ = "0.0.0-stub"
StructuralTag = Any


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    cls = type(name, (), {})
    globals()[name] = cls
    return cls
