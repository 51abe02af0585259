"""Model catalog: architecture numbers and the sizes derived from them.

Numbers are the models' `config.json` values (see `../shared/notes/hardware-and-models.md`
§1). Nothing here holds a timing.
"""
from __future__ import annotations

from dataclasses import dataclass
from difflib import get_close_matches

DTYPE_BYTES = 2  # bf16 weights and bf16 KV cache throughout


@dataclass(frozen=True, slots=True)
class GemmShape:
    """One linear op on a TP rank: activations [M x k] @ weights [k x n]."""

    name: str
    k: int
    n: int
    row_parallel: bool  # followed by an all-reduce under TP

    def flops(self, tokens: int) -> float:
        return 2.0 * tokens * self.k * self.n

    @property
    def weight_bytes(self) -> int:
        return self.k * self.n * DTYPE_BYTES


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    family: str
    num_layers: int
    hidden: int
    ffn: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab: int
    max_context: int  # tokens; Qwen3 uses its native 32,768 (no YaRN)
    qk_norm: bool = False
    tied_embeddings: bool = False

    # -- parameter counts --------------------------------------------------------------
    @property
    def params_per_layer(self) -> int:
        h, hd = self.hidden, self.head_dim
        attn = h * self.num_heads * hd * 2 + h * self.num_kv_heads * hd * 2
        mlp = 3 * h * self.ffn
        norms = 2 * h + (2 * hd if self.qk_norm else 0)
        return attn + mlp + norms

    @property
    def num_params(self) -> int:
        emb = self.vocab * self.hidden
        head = 0 if self.tied_embeddings else emb
        return emb + head + self.num_layers * self.params_per_layer + self.hidden

    @property
    def weight_bytes(self) -> int:
        return self.num_params * DTYPE_BYTES

    def weight_bytes_per_rank(self, tp: int) -> int:
        """Weights held by one TP rank: everything sharded by t except the norms."""
        norms = self.num_layers * (2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0))
        norms += self.hidden
        return (self.num_params - norms) * DTYPE_BYTES // tp + norms * DTYPE_BYTES

    # -- KV cache ------------------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * DTYPE_BYTES

    def kv_bytes_per_token_per_rank(self, tp: int) -> int:
        self.check_tp(tp)
        return self.kv_bytes_per_token // tp

    def kv_bytes_per_token_per_layer(self, tp: int = 1) -> int:
        return self.kv_bytes_per_token_per_rank(tp) // self.num_layers

    # -- shapes under tensor parallelism --------------------------------------------------
    def check_tp(self, tp: int) -> None:
        if tp < 1 or self.num_kv_heads % tp or self.num_heads % tp:
            raise ValueError(
                f"{self.name}: TP degree {tp} must divide {self.num_heads} heads and "
                f"{self.num_kv_heads} KV heads"
            )

    def gemms(self, tp: int = 1) -> tuple[GemmShape, ...]:
        """The per-layer linear ops on one rank (QKV and gate/up packed as vLLM does)."""
        self.check_tp(tp)
        h, hd = self.hidden, self.head_dim
        q_out = self.num_heads * hd
        qkv_n = (self.num_heads + 2 * self.num_kv_heads) * hd
        return (
            GemmShape("qkv", h, qkv_n // tp, False),
            GemmShape("o", q_out // tp, h, True),
            GemmShape("gate_up", h, 2 * self.ffn // tp, False),
            GemmShape("down", self.ffn // tp, h, True),
        )

    def lm_head(self, tp: int = 1) -> GemmShape:
        self.check_tp(tp)
        return GemmShape("lm_head", self.hidden, -(-self.vocab // tp), False)

    def flops_per_token_dense(self, tp: int = 1) -> float:
        """Linear-layer FLOPs per token on one rank, all layers, without the LM head."""
        return self.num_layers * sum(g.flops(1) for g in self.gemms(tp))

    def heads_per_rank(self, tp: int) -> tuple[int, int]:
        self.check_tp(tp)
        return self.num_heads // tp, self.num_kv_heads // tp

    def prefill_attn_flops_per_layer(self, work_tokens2: float, tp: int = 1) -> float:
        """FLOPs of causal attention on one rank, one layer, for Σ chunk·(ctx+(chunk+1)/2)."""
        nh, _ = self.heads_per_rank(tp)
        return 4.0 * nh * self.head_dim * work_tokens2


def _m(**kw) -> ModelSpec:
    return ModelSpec(**kw)


CATALOG: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _m(name="llama-3.1-8b", family="llama", num_layers=32, hidden=4096, ffn=14336,
           num_heads=32, num_kv_heads=8, head_dim=128, vocab=128256, max_context=131072),
        _m(name="llama-3.1-70b", family="llama", num_layers=80, hidden=8192, ffn=28672,
           num_heads=64, num_kv_heads=8, head_dim=128, vocab=128256, max_context=131072),
        _m(name="qwen3-8b", family="qwen3", num_layers=36, hidden=4096, ffn=12288,
           num_heads=32, num_kv_heads=8, head_dim=128, vocab=151936, max_context=32768,
           qk_norm=True),
        _m(name="qwen3-14b", family="qwen3", num_layers=40, hidden=5120, ffn=17408,
           num_heads=40, num_kv_heads=8, head_dim=128, vocab=151936, max_context=32768,
           qk_norm=True),
        _m(name="qwen3-32b", family="qwen3", num_layers=64, hidden=5120, ffn=25600,
           num_heads=64, num_kv_heads=8, head_dim=128, vocab=151936, max_context=32768,
           qk_norm=True),
    )
}


class UnknownNameError(ValueError):
    """A catalog lookup failed; the message lists what is known."""


def unknown_name(kind: str, name: str, known) -> UnknownNameError:
    known = sorted(known)
    hint = get_close_matches(name, known, n=1)
    did = f" (did you mean {hint[0]!r}?)" if hint else ""
    return UnknownNameError(f"unknown {kind} {name!r}{did}; known: {', '.join(known)}")


def get_model(name: str) -> ModelSpec:
    try:
        return CATALOG[name.lower()]
    except KeyError:
        raise unknown_name("model", name, CATALOG) from None
