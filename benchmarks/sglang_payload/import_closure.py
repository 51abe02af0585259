"""Which third-party modules SGLang's Engine path imports when its modules load, read from the
unpacked payload's source (no import is run): every module-level `import` outside `try`
blocks and `if TYPE_CHECKING`, followed through every package the payload holds (sglang,
sgl_kernel, flashinfer, openai, ...; parent packages included).
`if` bodies are kept, so platform branches (ROCm, NPU, macOS) show up: those are listed in
CONDITIONAL with the condition that guards them. A name found neither in the payload nor in
the device image (IMAGE) would fail the Engine's import on the device.

    python benchmarks/sglang_payload/import_closure.py [.sglang/site]
"""
from __future__ import annotations

import ast
import os
import sys

STARTS = ("sglang.srt.entrypoints.engine", "sglang.srt.managers.scheduler",
          "sglang.srt.managers.tokenizer_manager", "sglang.srt.managers.detokenizer_manager",
          "sglang.srt.model_executor.model_runner", "sglang.srt.models.llama",
          "sglang.srt.models.qwen3", "sglang.srt.layers.attention.flashattention_backend",
          "sglang.srt.layers.sampler")
# import names of the device image's packages (KINDS.md's package list, read 2026-11-17)
IMAGE = frozenset("""PIL aiohttp attr certifi charset_normalizer click cloudpickle cuda cupy
einops filelock fsspec h11 httpcore httpx huggingface_hub idna jinja2 markupsafe msgpack
networkx numba numpy packaging pandas psutil pyarrow pynvml regex requests safetensors scipy
sentencepiece six sympy tabulate tiktoken tokenizers torch torchvision tqdm transformers triton
typing_extensions urllib3 uvloop yaml anyio annotated_doc""".split()) | {"__main__"}
# found by the walk but guarded by a branch the Engine on one H200 does not take
CONDITIONAL = {"aiter": "ROCm only (is_hip)", "mlx": "macOS only", "torch_npu": "Ascend NPU only",
               "sgl_kernel_npu": "Ascend NPU only",
               "modelscope": "only with SGLANG_USE_MODELSCOPE set",
               "dequant_k_cache": "under `if __name__ == '__main__'`",
               "cudnn": "flashinfer: only if nvidia-cudnn-frontend is installed",
               "annotationlib": "msgspec: Python >= 3.14 only",
               "exceptiongroup": "starlette: Python < 3.11 only"}


def _path(site: str, mod: str) -> str | None:
    p = os.path.join(site, *mod.split("."))
    for c in (p + ".py", os.path.join(p, "__init__.py")):
        if os.path.exists(c):
            return c
    return None


def _module_imports(tree: ast.Module):
    """Import statements that run when the module loads (not in try, not type-only)."""
    stack = list(tree.body)
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            yield n
        elif isinstance(n, ast.If) and "TYPE_CHECKING" not in ast.dump(n.test):
            stack += n.body + n.orelse


def _names(n, pkg: str) -> list[str]:
    if isinstance(n, ast.Import):
        return [a.name for a in n.names]
    if n.level:
        base = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)]
        b = ".".join(base + ([n.module] if n.module else []))
    else:
        b = n.module or ""
    return [b] + [f"{b}.{a.name}" for a in n.names]


def payload_names(site: str) -> set[str]:
    return {n.split("-")[0].removesuffix(".py") for n in os.listdir(site)}


def hard_imports(site: str, starts=STARTS) -> dict[str, str]:
    """{top-level name outside the payload: the first module that imports it}."""
    std, ours = set(sys.stdlib_module_names), payload_names(site)
    seen, third, todo = set(), {}, list(starts)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        parts = m.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        p = _path(site, m)
        if p is None:
            continue
        try:
            with open(p, encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (SyntaxError, UnicodeDecodeError):
            continue
        pkg = m if p.endswith("__init__.py") else ".".join(parts[:-1])
        for n in _module_imports(tree):
            for name in _names(n, pkg):
                top = name.split(".")[0]
                if top in ours:
                    todo.append(name)
                elif top and top not in std:
                    third.setdefault(top, m)
    return third


def missing(site: str, starts=STARTS) -> dict[str, str]:
    """Modules the Engine path imports that neither the payload nor the image holds."""
    return {t: m for t, m in hard_imports(site, starts).items()
            if t not in IMAGE and t not in CONDITIONAL}


def main(argv=None) -> int:
    site = (argv or sys.argv[1:] or [".sglang/site"])[0]
    if not os.path.isdir(site):
        print(f"import_closure: {site}: no such folder (run build.sh first)", file=sys.stderr)
        return 2
    gone = missing(site)
    for t, m in sorted(gone.items()):
        print(f"missing: {t} (imported by {m})")
    print(f"{len(hard_imports(site))} modules outside the payload on the Engine path, "
          f"{len(gone)} missing from the image")
    return 1 if gone else 0


if __name__ == "__main__":
    raise SystemExit(main())
