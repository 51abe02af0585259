"""Build step beside pyproject.toml: compile simserve's hot modules with Cython.

Everything else about the package is in pyproject.toml. The modules and Cython's directives
are listed in simserve/compiled.py. Each module compiles from its own .py (and the .pxd beside
it, where there is one) into an extension module beside it in the wheel; Python's import
system prefers the extension module to the .py of the same name.

- `pip install .` and `pip wheel .` compile (a C compiler is needed; Cython is a build
  requirement). `SIMSERVE_NO_COMPILE=1` skips it.
- `pip install -e .` does not compile: an editable checkout runs pure Python.
  `SIMSERVE_COMPILE=1 pip install -e .` compiles into the checkout, beside each .py.
- Compiling is never fatal: if it fails, the package installs as pure Python (the same
  results, slower) and the build says so.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def _plan():
    """simserve/compiled.py, loaded by path (simserve's dependencies may not be installed)."""
    spec = importlib.util.spec_from_file_location("_simserve_compiled_plan",
                                                  HERE / "simserve" / "compiled.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


PLAN = _plan()


def _say(msg: str) -> None:
    """To stderr, and to the terminal too: pip shows a build's output only with -v, and a user
    waiting for the compile, or getting a slower pure-Python install, should see it."""
    print(f"simserve build: {msg}", file=sys.stderr, flush=True)
    try:
        with open("/dev/tty", "w") as tty:
            tty.write(f"simserve build: {msg}\n")
    except OSError:  # no terminal (CI): stderr, and `simserve --version`, say it
        pass


def _skip_reason(editable: bool) -> str | None:
    """Why this build does not compile, or None."""
    if os.environ.get("SIMSERVE_NO_COMPILE"):
        return "SIMSERVE_NO_COMPILE is set"
    if editable and not os.environ.get("SIMSERVE_COMPILE"):
        return "an editable install; SIMSERVE_COMPILE=1 compiles it"
    return None


class OptionalBuildExt(build_ext):
    """Translate the listed modules with Cython and compile them; any failure leaves a
    pure-Python install."""

    def finalize_options(self):
        super().finalize_options()
        # setuptools sets editable_mode for a PEP 660 editable install (`pip install -e .`)
        self._skip = _skip_reason(bool(getattr(self, "editable_mode", False)))
        if self._skip is not None:
            self.extensions = []
            _say(f"not compiling ({self._skip}): pure Python")
        elif self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def run(self):
        if not self.extensions:
            return
        jobs = self.parallel if isinstance(self.parallel, int) else 1
        _say(f"compiling {len(self.extensions)} hot modules with Cython ({jobs} jobs)")
        try:
            self._translate(jobs)
            super().run()
        except Exception as e:  # no Cython, no C compiler, a compile or link error
            self._discard_outputs()
            _say(f"WARNING: compiling the hot modules failed ({type(e).__name__}: "
                 f"{str(e).splitlines()[0][:300] if str(e) else ''}); installing pure "
                 "Python (the same results, slower)")
            return
        _say("compiled the hot modules")

    def _translate(self, jobs: int) -> None:
        """Cython: each module's .py (with its .pxd) to C, in the build's temporary folder."""
        from Cython.Build import cythonize
        translated = cythonize(self.extensions, compiler_directives=dict(PLAN.DIRECTIVES),
                               nthreads=jobs, quiet=True,
                               build_dir=os.path.join(self.build_temp, "cython"))
        c_sources = {e.name: e.sources for e in translated}
        for ext in self.extensions:
            ext.sources = c_sources[ext.name]

    def _discard_outputs(self) -> None:
        """The modules that did compile before the failure go too: all or none ship."""
        for path in self.get_outputs():
            if path.endswith(tuple(PLAN.EXTENSION_SUFFIXES)) and os.path.isfile(path):
                os.remove(path)
        self.extensions = []


# no fused multiply-add: the compiled floats must be Python's, operation for operation (and no
# debug symbols: they would triple the wheel)
_ARGS = [] if sys.platform == "win32" else ["-ffp-contract=off", "-g0"]
setup(
    ext_modules=[Extension(m, [PLAN.source_path(m, Path("simserve")).as_posix()],
                           extra_compile_args=_ARGS) for m in PLAN.MODULES],
    cmdclass={"build_ext": OptionalBuildExt},
)
