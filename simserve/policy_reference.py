"""The policy reference: every option of every registered policy, its type, its default and its
documentation, read from the config dataclass's source (`simserve policies`, `docs/policies.md`).

An option's documentation is the comments written beside its field, read with `ast` and
`tokenize` from the module that defines the field (so it works on an installed wheel too):
- the block of comment lines directly above the field, at the field's indentation (a blank
  line, code, or a section header such as `# -- GPU engine ---` ends the block);
- the comment at the end of the field's line;
- comment lines directly below it that start further right than the field (continuations of
  that trailing comment).
A field a subclass redeclares without a comment keeps its base class's documentation.
Policies are found through `simserve.policies` (`policy_names`, `builtin_policies`,
`get_policy`); `docs/policies.md` documents the built-in ones only, so it does not depend on the
packages installed beside simserve."""
from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# built-in policy -> (what it models, in one line; where it comes from).
# tests/test_policy_reference.py checks it names exactly the built-in policies, so a new one
# must say what it is here; a third-party policy is described by its module's docstring.
SUMMARIES = {
    "vllm": ("vLLM V1 scheduler: running requests first, then waiting FCFS; chunked prefill "
             "under a token budget; recompute preemption of the newest request",
             "vLLM (PagedAttention, SOSP'23), V1 scheduler `vllm/v1/core/sched/scheduler.py`; "
             "defaults of `vllm_version` (0.22.1)"),
    "sarathi": ("Sarathi-Serve: decode-first stall-free batching, whole-prompt KV reserved at "
                "admission, the token budget as chunk size",
                "Sarathi-Serve (OSDI'24)"),
    "neo": ("NEO: GPU-gated CPU offloading: host KV pool, swap-out/in, Prefill-to-CPU, "
            "asymmetric pipeline of GPU dense work and CPU decode attention",
            "NEO (MLSys'25) and its code (`swiftllm`); A10 evaluation config"),
    "dualpace": ("DualPace: independent GPU and CPU engines (no shared iteration barrier), KV "
                 "safety envelope, Prefill-to-CPU, swaps, GPU Dense Assist at stage boundaries",
                 "DualPace (arXiv 2610.33501), §4–5, App. A–B; controls from the profiles (§4.3)"),
    "conflux": ("ConfluxServe: Ulysses-SP prefill chunks co-batched with rank-local decodes, "
                "waterfill dispatch, dual-mode placement, Moore–Hodgson admission",
                "ConfluxServe (arXiv 2610.37810), §5–6, §8.1, App. D–G"),
    "loongserve": ("LoongServe: elastic sequence-parallel prefill, temporally isolated from "
                   "decode; FCFS or SRPT (LoongServe++)",
                   "LoongServe (SOSP'24) and its router; ConfluxServe §8.1 settings"),
    "chunked": ("ConfluxServe's Chunked Prefill baseline: `vllm` over one TP group of all GPUs, "
                "vLLM 0.15.1 defaults; `scheduler: srpt` is Chunked++",
                "ConfluxServe (arXiv 2610.37810) §8.1"),
    "distserve": ("DistServe: prefill and decode on disjoint GPU halves, whole-prompt prefill "
                  "batches, KV hand-off over NVLink",
                  "DistServe (OSDI'24) and simdistserve, as ConfluxServe §8.1 ran it"),
    "muxwise": ("MuxWise: prefill and decode as concurrent streams on split SMs, decode given "
                "the fewest SMs that meet the TBT",
                "MuxWise (ASPLOS'26; SGLang `--enable-pdmux`), as ConfluxServe §8.1 ran it"),
}
# The serving engine each design ran on in its paper, and the host path simserve charges it
# (simserve/cost/host.py): only vLLM's was measured (validation/vllm-h200).
HOST_PATH = {
    "vllm": "vLLM V1; pays vLLM 0.22.1's measured host path (`engine`: default where measured, "
            "i.e. h200-sxm; `engine: vllm` on derived profiles)",
    "sarathi": "Sarathi-Serve's vLLM fork; the same vLLM host path as `vllm`",
    "chunked": "vLLM 0.15.1 (ConfluxServe §8.1); the same vLLM host path as `vllm` (0.22.1's, "
               "the only one measured), so on h200-sxm it pays it while ConfluxServe's designs "
               "pay generic overheads: checked on Fig. 12 Qwen3-14B, 4x H200, chunked++-4096, "
               "SLO attainment 0.932 / 0.878 at 5 / 6 req/s with it and 0.919 / 0.865 with "
               "`engine: generic`",
    "neo": "SwiftLLM (NEO's own engine), modelled from its code and not measured "
           "(`cost/swiftllm_host.py`, `host: swiftllm`): synchronous Python per iteration, "
           "request and token, each pipelined stage's launches serial with its CPU attention, "
           "no CUDA graphs, the profile's eager launch cost per torch call; no front end. "
           "Decisions read NEO's own profiled tables (`predictor: table`)",
    "dualpace": "DualPace's own Python/PyTorch engine behind FastAPI/Uvicorn (§5), not "
                "measured: generic per-step overheads, no front end",
    "conflux": "vLLM (ConfluxServe §7), but a different engine loop: generic per-step overheads "
               "for every design it is compared with, no front end",
    "loongserve": "LoongServe's own engine (LightLLM-based), not measured: generic overheads, "
                  "no front end",
    "distserve": "vLLM's disaggregated serving (ConfluxServe §8.1); generic overheads like the "
                 "designs it is compared with, no front end",
    "muxwise": "SGLang (`--enable-pdmux`), not measured: generic overheads, no front end",
}
_SECTION = re.compile(r"#\s*--")


@dataclass(frozen=True, slots=True)
class Option:
    name: str
    type: str        # the annotation as written, e.g. "int | None"
    default: str     # as a YAML value: null, true, 0.9, fcfs
    doc: str         # "" when the source says nothing about it


@dataclass(frozen=True, slots=True)
class PolicyDoc:
    name: str
    summary: str
    source: str
    config: str      # module.Class of the config dataclass
    options: tuple[Option, ...]


def yaml_value(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


@lru_cache(maxsize=None)
def _file_fields(path: str, class_name: str) -> dict[str, tuple[str, str]]:
    """field -> (annotation, documentation) for the fields class `class_name` declares in the
    Python file `path`."""
    text = Path(path).read_text(encoding="utf-8")
    lines = text.splitlines()
    comments: dict[int, tuple[int, str, bool]] = {}  # line -> (column, text, comment-only line)
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            only = not lines[row - 1][:col].strip()
            comments[row] = (col, tok.string.lstrip("#").strip(), only)
    cls = next((n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ClassDef)
                and n.name == class_name), None)
    if cls is None:
        raise LookupError(f"{path}: no class {class_name}")
    out = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        col, first, last = node.col_offset, node.lineno, node.end_lineno
        above = []
        row = first - 1
        while row in comments and comments[row][2] and comments[row][0] == col \
                and not _SECTION.match(lines[row - 1].strip()):
            above.insert(0, comments[row][1])
            row -= 1
        after = [comments[r][1] for r in range(first, last + 1)
                 if r in comments and not comments[r][2]]
        row = last + 1
        while after and row in comments and comments[row][2] and comments[row][0] > col:
            after.append(comments[row][1])
            row += 1
        doc = _join([" ".join(above), " ".join(after)])
        out[node.target.id] = (ast.unparse(node.annotation), doc)
    return out


def _join(parts: list[str]) -> str:
    """The block above and the trailing comment as one text (a '; ' between unless the first
    already ends a clause)."""
    out = ""
    for p in (x.strip() for x in parts):
        if p:
            out = p if not out else out + (" " if out[-1] in ".;:," else "; ") + p
    return out


def _declared(cls: type, name: str) -> list[tuple[str, str]]:
    """(annotation, doc) of `name` in every class of cls's MRO that declares it, nearest first."""
    found = []
    for klass in cls.__mro__:
        if name not in klass.__dict__.get("__annotations__", {}):
            continue
        mod = sys.modules.get(klass.__module__)
        path = getattr(mod, "__file__", None) or inspect.getsourcefile(klass)
        found.append(_file_fields(str(path), klass.__name__)[name])
    return found


def config_options(cls: type) -> tuple[Option, ...]:
    """Every field of the config dataclass `cls`, documented from its source."""
    out = []
    for f in dataclasses.fields(cls):
        declared = _declared(cls, f.name)
        ann = declared[0][0] if declared else str(f.type)
        doc = next((d for _, d in declared if d), "")
        if f.default is not dataclasses.MISSING:
            default = yaml_value(f.default)
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = yaml_value(f.default_factory())  # type: ignore[misc]
        else:
            default = "(required)"
        out.append(Option(f.name, ann, default, doc))
    return tuple(out)


def _module_line(build) -> str:
    doc = inspect.getmodule(build).__doc__ or ""
    return doc.strip().split("\n\n")[0].replace("\n", " ")


def policy_summary(name: str) -> tuple[str, str]:
    """(what it models, source) of a registered policy; its module is imported only when it has
    no entry in SUMMARIES (then its build module's docstring speaks for it). A deprecated name
    says which policy it now is."""
    from simserve.policies import ALIASES
    if name in ALIASES:
        return (f"deprecated name of `{ALIASES[name]}` (its `router` option)",
                SUMMARIES[ALIASES[name]][1])
    if name in SUMMARIES:
        return SUMMARIES[name]
    from simserve.policies import get_policy
    build = get_policy(name)[1]
    return _module_line(build), f"`{build.__module__}` (not built in)"


def policy_doc(name: str) -> PolicyDoc:
    from simserve.policies import get_policy
    cls, _ = get_policy(name)
    summary, source = policy_summary(name)
    return PolicyDoc(name, summary, source, f"{cls.__module__}.{cls.__qualname__}",
                     config_options(cls))


def all_policy_docs(builtin_only: bool = False) -> list[PolicyDoc]:
    """Every policy that can be named (built-ins, entry points, run-time registrations), or the
    built-in ones only."""
    from simserve.policies import builtin_policies, policy_names
    names = sorted(builtin_policies()) if builtin_only else policy_names()
    return [policy_doc(n) for n in names]


def _cell(s: str) -> str:
    return s.replace("|", "\\|")


def markdown(docs: list[PolicyDoc] | None = None) -> str:
    """docs/policies.md: an index of the built-in policies, then each one's options."""
    docs = all_policy_docs(builtin_only=True) if docs is None else docs
    out = ["# Policy reference", "",
           "Generated from the policies' config dataclasses by `simserve policies --markdown "
           "> docs/policies.md`;",
           "do not edit by hand (`tests/test_policy_reference.py` fails when it is stale). "
           "An option is set in an",
           "experiment's `policies:` list, e.g. `- {name: vllm, max_num_batched_tokens: "
           "4096}`, or with",
           "`--set policies.0.max_num_batched_tokens=4096`; `null` defaults are resolved when "
           "the policy is built,",
           "as each description says.", "",
           "| policy | what it models | source |", "|---|---|---|"]
    from simserve.policies import ALIASES
    deprecated = ", ".join(f"`{a}` (policy `{p}` with its `router` option)"
                           for a, p in sorted(ALIASES.items()))
    out += [f"| [`{d.name}`](#{d.name}) | {_cell(d.summary)} | {_cell(d.source)} |"
            for d in docs]
    out += ["", f"Deprecated names, still accepted with a warning: {deprecated}."]
    for d in docs:
        host = f" Engine and host path: {HOST_PATH[d.name]}." if d.name in HOST_PATH else ""
        out += ["", f"## {d.name}", "", f"{d.summary}.", "",
                f"Source: {d.source}. Config: `{d.config}`.{host}", "",
                "| option | type | default | what it is |", "|---|---|---|---|"]
        out += [f"| `{o.name}` | `{_cell(o.type)}` | `{_cell(o.default)}` | {_cell(o.doc)} |"
                for o in d.options]
    return "\n".join(out) + "\n"
