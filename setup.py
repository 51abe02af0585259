"""Build step beside pyproject.toml: compile simserve's hot modules with Cython.

Everything else about the package is in pyproject.toml. The modules and the directives are
listed in simserve/compiled.py, which also says when a compiled copy is used. The copies go to
simserve/_compiled/ (never beside the .py files, where they would shadow an edited source),
with a manifest of each source's sha256. Compiling is optional: without Cython or a C
compiler, or with SIMSERVE_NO_COMPILE=1, the package installs as pure Python (a warning says
so), and runs the same.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
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
SKIP = bool(os.environ.get("SIMSERVE_NO_COMPILE"))
OUT = ("simserve", PLAN.OUT_DIR)  # the compiled copies' folder, from the package's parent


def _say(msg: str) -> None:
    """To stderr, and to the terminal too: pip shows a build's output only with -v, and a
    user waiting minutes for the compile, or getting a slower pure-Python install, should
    see it."""
    print(msg, file=sys.stderr, flush=True)
    try:
        with open("/dev/tty", "w") as tty:
            tty.write(msg + "\n")
    except OSError:  # no terminal (CI): stderr, and `simserve --version`, say it
        pass


def _warn(msg: str) -> None:
    _say(f"simserve build: WARNING: {msg}; installing pure Python (the same results, slower)")


class BuildCompiled(build_ext):
    """Compile the listed modules, each under simserve/_compiled/, and write the manifest;
    any failure leaves a pure-Python install. (With Cython importable, setuptools' build_ext
    is Cython's, which translates each module to C in the build's temporary folder.)"""

    def finalize_options(self):
        super().finalize_options()
        self._compile = bool(self.extensions) and not SKIP
        if SKIP:
            _warn("SIMSERVE_NO_COMPILE is set")
        elif self._compile and not hasattr(self, "cython_directives"):
            _warn("Cython is not installed")
            self._compile = False
        if not self._compile:
            self._why = "SIMSERVE_NO_COMPILE is set" if SKIP else "Cython is not installed"
            self.extensions = []
            return
        self.cython_directives = dict(PLAN.DIRECTIVES)
        self.cython_c_in_temp = True
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def run(self):
        if not self._compile:
            self._record_failure(getattr(self, "_why", "nothing to compile"))
            return
        every = self.extensions
        reused = self._reuse_in_tree()
        self.extensions = [e for e in every if e.name not in reused]
        if reused:
            _say(f"simserve build: reusing {len(reused)} compiled hot modules of "
                 "simserve/_compiled/ (built from these same sources)")
        try:
            if self.extensions:
                self._compile_rest()
        except Exception as e:  # no C compiler, a compile or link error: pure Python
            why = f"compiling the hot modules failed ({type(e).__name__}: {e})"
            _warn(why)
            self._compile = False
            self._record_failure(why)
            return
        finally:
            self.extensions = every
        self._write_manifest()
        self._forget_failure()

    def _compile_rest(self) -> None:
        _say(f"simserve build: compiling {len(self.extensions)} hot modules with Cython "
             f"({self.parallel} jobs; about 3 CPU-minutes for all of them)")
        if self.inplace:  # the editable install's copies go to folders that may not exist yet
            build_py = self.get_finalized_command("build_py")
            for ext in self.extensions:
                os.makedirs(os.path.dirname(self._get_inplace_equivalent(build_py, ext)[0]),
                            exist_ok=True)
        super().run()
        _say("simserve build: compiled the hot modules")

    def _forget_failure(self) -> None:
        """A failure recorded by an earlier build is gone."""
        for d in self._out_dirs():
            (d / PLAN.BUILD_FAILED).unlink(missing_ok=True)

    def _reuse_in_tree(self) -> set[str]:
        """One compile per checkout: the modules whose copy in simserve/_compiled/ (an
        editable install's) was built by this Cython with these directives from a source
        whose sha256 is unchanged are copied into the build instead of compiled again."""
        src = HERE / "simserve" / PLAN.OUT_DIR
        try:
            man = json.loads((src / PLAN.MANIFEST).read_text())
            from Cython import __version__ as cython_version
        except (OSError, ValueError, ImportError):
            return set()
        if man.get("cython") != cython_version or man.get("directives") != PLAN.DIRECTIVES:
            return set()
        reused = set()
        dest = Path(self.build_lib).joinpath(*OUT)
        for ext in self.extensions:
            entry = man.get("modules", {}).get(ext.name) or {}
            rel = PLAN.compiled_relpath(ext.name, _suffix(self._rel(ext.name)))
            if entry.get("file") != rel or not (src / rel).is_file() or entry.get("sha256") \
                    != PLAN.source_sha256(PLAN.source_path(ext.name, HERE / "simserve")):
                continue
            if (dest / rel).resolve() != (src / rel).resolve():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src / rel, dest / rel)
            reused.add(ext.name)
        return reused

    def _record_failure(self, why: str) -> None:
        """simserve/_compiled/BUILD_FAILED: `simserve --version` reports it. The build
        folder's compiled copies of an earlier build go (they would ship beside it)."""
        shutil.rmtree(Path(self.build_lib).joinpath(*OUT), ignore_errors=True)
        for d in self._out_dirs():
            d.mkdir(parents=True, exist_ok=True)
            (d / PLAN.BUILD_FAILED).write_text(why.splitlines()[0][:300] + "\n")

    def _rel(self, ext_name: str) -> str:
        """simserve/_compiled/<sub-path>/<module><suffix>: never beside the .py it would
        shadow (the finder loads it under the module's own name)."""
        suffix = _suffix(self.get_ext_filename(ext_name.rpartition(".")[2]))
        return "/".join([*OUT, PLAN.compiled_relpath(ext_name, suffix)])

    def get_ext_fullpath(self, ext_name: str) -> str:
        return os.path.join(self.build_lib, *self._rel(ext_name).split("/"))

    def _get_inplace_equivalent(self, build_py, ext):
        """(In the source tree, in the build folder): where an editable install copies each
        compiled file (setuptools >= 64 would put it beside the module's .py)."""
        rel = self._rel(self.get_ext_fullname(ext.name)).split("/")
        return (os.path.join(build_py.get_package_dir(rel[0]), *rel[1:]),
                os.path.join(self.build_lib, *rel))

    def _out_dirs(self) -> list[Path]:
        """The _compiled folders this build fills: in the build folder and, for an editable
        install, in the source tree."""
        build_py = self.get_finalized_command("build_py")
        dirs = [Path(self.build_lib).joinpath(*OUT)]
        if self.inplace:
            dirs.append(Path(build_py.get_package_dir(OUT[0])) / OUT[1])
        return dirs

    def _write_manifest(self) -> None:
        modules = {}
        for ext in self.extensions:
            rel = self._rel(ext.name)
            if not (Path(self.build_lib) / rel).is_file():
                _warn(f"{rel} was not built")
                return
            modules[ext.name] = {
                "sha256": PLAN.source_sha256(PLAN.source_path(ext.name, HERE / "simserve")),
                "file": PLAN.compiled_relpath(ext.name, _suffix(rel))}
        from Cython import __version__ as cython_version
        text = json.dumps({"cython": cython_version, "directives": PLAN.DIRECTIVES,
                           "modules": modules}, indent=1, sort_keys=True) + "\n"
        for d in self._out_dirs():
            (d / PLAN.MANIFEST).write_text(text)

    def get_outputs(self):
        outs = super().get_outputs()
        name = PLAN.MANIFEST if self._compile else PLAN.BUILD_FAILED
        outs.append(str(Path(self.build_lib).joinpath(*OUT, name)))
        return outs


def _suffix(path: str) -> str:
    """The extension-module suffix of a built file's name (".cpython-311-x86_64-linux-gnu.so")."""
    name = os.path.basename(path)
    return name[name.index("."):]


# no fused multiply-add: the compiled floats must be Python's, operation for operation (and no
# debug symbols: they would triple the wheel)
_ARGS = [] if sys.platform == "win32" else ["-ffp-contract=off", "-g0"]
setup(
    ext_modules=[Extension(m, [str(PLAN.source_path(m, Path("simserve")))],
                           extra_compile_args=_ARGS) for m in PLAN.MODULES],
    cmdclass={"build_ext": BuildCompiled},
)
