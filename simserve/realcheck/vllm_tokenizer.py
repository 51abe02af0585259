"""A model folder real vLLM can serve without downloading anything: the model's `config.json`
(hand-written from its published config, `vllm_configs/`) for `--load-format dummy`, and a
word-level tokenizer with the model's vocabulary size, saved with `tokenizers`.

Token id i is the word `t<i>`, split on whitespace: a prompt of n words is n tokens, so the
client controls prompt lengths exactly. Its cost differs from the real BPE tokenizer's (a
dictionary lookup per word instead of merges): `benchmarks/tokenizer_costs.py` times both on
the CPU, and the host-path model takes the tokeniser cost from those figures.
"""
from __future__ import annotations

import json
import os

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_configs")


def model_dir(model: str, root: str) -> str:
    """Create (once) and return `root/model` holding config.json and the tokenizer."""
    path = os.path.join(root, model)
    if os.path.exists(os.path.join(path, "tokenizer.json")):
        return path
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(CONFIGS, f"{model}.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {f"t{i}": i for i in range(int(cfg["vocab_size"]))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(os.path.join(path, "tokenizer.json"))
    eos = cfg["eos_token_id"][0] if isinstance(cfg["eos_token_id"], list) else cfg["eos_token_id"]
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": f"t{cfg['bos_token_id']}",
                   "eos_token": f"t{eos}", "unk_token": "t0",
                   "model_max_length": int(cfg["max_position_embeddings"]),
                   "clean_up_tokenization_spaces": False}, f, indent=1)
    return path
