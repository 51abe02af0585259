"""CPU cost of the host path's tokenizer work: a word-level stand-in vs a byte-level BPE.

    pip install tokenizers            # or: pip install -e .[bench] in a checkout of your own
    python benchmarks/tokenizer_costs.py [--corpus-mb 40] [--vocab 128256]

A real vLLM server tokenises every prompt and detokenises every output token on the CPU. When
the real tokenizer cannot be downloaded (the GPU machine has no network), a word-level
tokenizer of the model's vocabulary size serves in its place; this script tells how far its
cost is from a real byte-level BPE's. Both are built here from text found locally (the Python
sources and docs under site-packages): (a) a WordLevel model over the 128,256 most frequent
whitespace-separated words (padded with filler entries if the corpus has fewer; decoding
joins words with spaces, and a variant adds a WordPiece decoder's cleanup), (b) a
byte-level BPE trained to 128,256 entries (Llama-3.1-8B's vocabulary size) on the same text.

Timed as CPU time of the calling thread (time.thread_time, so waiting behind other processes
on a shared machine is not counted), single-threaded (RAYON_NUM_THREADS=1, as one request is
encoded by one thread):
  encode   `Tokenizer.encode` of prompts cut to 100 .. 8,000 tokens of the tokenizer itself,
           per prompt token: median over repeats (and the least, the least disturbed run)
  detok    incremental detokenisation per output token, both ways vLLM V1 does it:
           `DecodeStream.step` (tokenizers >= 0.21.1, vLLM's fast path) and a sliding window
           (decode ids[prefix:] and ids[prefix:read] per step, vLLM's fallback path), over
           1,024-token outputs with the prompt as context
The machine's load (`uptime`) is printed before and after: the numbers are only as good as
the CPU was free.
"""
from __future__ import annotations

import argparse
import collections
import os
import platform
import re
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # must be set before tokenizers is imported
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

try:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
    from tokenizers.decoders import DecodeStream  # noqa: E402
except ImportError:  # pragma: no cover
    sys.exit("tokenizers is not installed: pip install tokenizers (or the [bench] extra)")

PROMPT_LENS = (100, 250, 500, 1000, 2000, 4000, 8000)
OUTPUT_LEN = 1024
INITIAL_WINDOW = 5  # tokens of context before the first detokenised token (sliding window)


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "uptime unavailable; loadavg " + " ".join(map(str, os.getloadavg()))


def corpus_files(limit_bytes: int, held_bytes: int = 4_000_000) -> tuple[list[Path], list[Path]]:
    """Text files under site-packages in a fixed order: every 10th is held out (prompts and
    outputs are cut from files the BPE was not trained on), the rest train up to limit_bytes."""
    root = Path(sysconfig.get_paths()["purelib"])
    files = sorted(p for ext in ("py", "md", "rst", "txt") for p in root.rglob(f"*.{ext}")
                   if p.is_file())
    train, held, n_train, n_held = [], [], 0, 0
    for i, p in enumerate(files):
        size = p.stat().st_size
        if size < 2_000 or size > 400_000:
            continue
        if i % 10 == 0 and n_held < held_bytes:
            held.append(p)
            n_held += size
        elif i % 10 and n_train < limit_bytes:
            train.append(p)
            n_train += size
        if n_train >= limit_bytes and n_held >= held_bytes:
            break
    return train, held


def read(p: Path) -> str:
    return p.read_text(encoding="utf-8", errors="replace")


def build_word_level(files: list[Path], vocab_size: int) -> tuple[Tokenizer, int]:
    counts: collections.Counter = collections.Counter()
    for p in files:
        counts.update(read(p).split())
    words = [w for w, _ in counts.most_common(vocab_size - 1)]
    real = len(words)
    words += [f"<filler_{i}>" for i in range(vocab_size - 1 - real)]
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok, real  # no decoder: decode joins the words with spaces


def with_wordpiece_decoder(tok: Tokenizer) -> Tokenizer:
    """The same word-level tokenizer with a WordPiece decoder (space joining plus its cleanup
    of spaces before punctuation), another plausible stand-in configuration."""
    other = Tokenizer.from_str(tok.to_str())
    other.decoder = decoders.WordPiece(prefix="##")
    return other


def build_bpe(files: list[Path], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|begin_of_text|>", "<|end_of_text|>"])
    tok.train([str(p) for p in files], trainer)
    return tok


def held_out_text(files: list[Path], need_chars: int) -> str:
    parts, n = [], 0
    for p in files:
        t = read(p)
        parts.append(t)
        n += len(t)
        if n >= need_chars:
            break
    return "\n".join(parts)


def cut(tok: Tokenizer, text: str, start: int, n_tokens: int) -> str:
    """The text of n_tokens consecutive tokens of `tok`, starting near character `start`."""
    enc = tok.encode(text[start:start + 40 * n_tokens + 1000], add_special_tokens=False)
    if len(enc.ids) < n_tokens + 1:
        raise RuntimeError("held-out text too short for the longest prompt")
    end = enc.offsets[n_tokens - 1][1]
    return text[start:start + end]


def time_it(fn, min_time: float = 0.2, min_reps: int = 5) -> tuple[float, float]:
    """Median and least CPU seconds of this thread per call (time.thread_time: a call preempted by other
    processes on a busy machine is not charged for the wait), over at least min_reps calls and
    min_time CPU seconds."""
    times, t_total = [], 0.0
    while len(times) < min_reps or t_total < min_time:
        t0 = time.thread_time()
        fn()
        dt = time.thread_time() - t0
        times.append(dt)
        t_total += dt
        if len(times) >= 200:
            break
    return float(np.median(times)), float(np.min(times))


def encode_costs(tok: Tokenizer, text: str, seed: int = 0) -> dict[int, tuple[float, float]]:
    """Per prompt length: (median, least) CPU microseconds per token over three prompts."""
    rng = np.random.default_rng(seed)
    out = {}
    for n in PROMPT_LENS:
        med, low = [], []
        for _ in range(3):  # three different prompts of each length
            start = int(rng.integers(0, len(text) // 2))
            prompt = cut(tok, text, start, n)
            ntok = len(tok.encode(prompt, add_special_tokens=False).ids)
            m, lo = time_it(lambda: tok.encode(prompt, add_special_tokens=True))
            med.append(m / ntok * 1e6)
            low.append(lo / ntok * 1e6)
        out[n] = (float(np.median(med)), float(np.min(low)))
    return out


def detok_stream(tok: Tokenizer, prompt_ids: list[int], out_ids: list[int]) -> float:
    """Seconds for DecodeStream over out_ids after the prompt (vLLM V1's fast path)."""
    stream = DecodeStream(skip_special_tokens=True)
    for t in prompt_ids[-INITIAL_WINDOW:]:  # prime with the prompt tail, as vLLM does
        stream.step(tok, t)
    t0 = time.thread_time()
    for t in out_ids:
        stream.step(tok, t)
    return time.thread_time() - t0


def detok_window(tok: Tokenizer, prompt_ids: list[int], out_ids: list[int]) -> float:
    """Seconds for sliding-window incremental detokenisation over out_ids: each step decodes
    the window from prefix to the end and from prefix to read; when the new text is complete
    (no trailing replacement character) the window moves up (vLLM's fallback path)."""
    ids = list(prompt_ids)
    prefix, read = max(0, len(ids) - INITIAL_WINDOW), len(ids)
    text = []
    t0 = time.thread_time()
    for t in out_ids:
        ids.append(t)
        prefix_text = tok.decode(ids[prefix:read], skip_special_tokens=True)
        new_text = tok.decode(ids[prefix:], skip_special_tokens=True)
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            text.append(new_text[len(prefix_text):])
            prefix, read = read, len(ids)
    return time.thread_time() - t0


def detok_costs(tok: Tokenizer, text: str, seed: int = 1) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    res = {"stream": [], "window": []}
    for _ in range(5):
        start = int(rng.integers(0, len(text) // 2))
        ids = tok.encode(cut(tok, text, start, 1000 + OUTPUT_LEN), add_special_tokens=False).ids
        prompt_ids, out_ids = ids[:1000], ids[1000:1000 + OUTPUT_LEN]
        for name, fn in (("stream", detok_stream), ("window", detok_window)):
            fn(tok, prompt_ids, out_ids[:64])  # warm
            res[name].append(fn(tok, prompt_ids, out_ids) / len(out_ids) * 1e6)
    return {k: float(np.median(v)) for k, v in res.items()}


def chars_per_token(tok: Tokenizer, text: str) -> float:
    sample = text[: 400_000]
    return len(sample) / len(tok.encode(sample, add_special_tokens=False).ids)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus-mb", type=float, default=40.0)
    ap.add_argument("--vocab", type=int, default=128_256, help="Llama-3.1-8B's vocabulary size")
    args = ap.parse_args(argv)

    print(f"tokenizer costs on this CPU ({platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} logical CPUs, python {platform.python_version()}, "
          f"tokenizers {__import__('tokenizers').__version__}, RAYON_NUM_THREADS="
          f"{os.environ['RAYON_NUM_THREADS']})")
    print(f"load before: {uptime()}")
    train, held = corpus_files(int(args.corpus_mb * 1e6))
    n_bytes = sum(p.stat().st_size for p in train)
    print(f"corpus: {len(train)} files, {n_bytes / 1e6:.1f} MB of .py/.md/.rst/.txt under "
          f"site-packages (training); {len(held)} other files held out for prompts/outputs")

    t0 = time.perf_counter()
    word, real = build_word_level(train, args.vocab)
    t_word = time.perf_counter() - t0
    t0 = time.perf_counter()
    bpe = build_bpe(train, args.vocab)
    t_bpe = time.perf_counter() - t0
    print(f"(a) word-level: vocabulary {word.get_vocab_size():,} ({real:,} corpus words, "
          f"{args.vocab - 1 - real:,} filler), built in {t_word:.1f} s")
    print(f"(b) byte-level BPE: vocabulary {bpe.get_vocab_size():,}, trained in {t_bpe:.1f} s "
          f"(single-threaded)")

    text = held_out_text(held, 3_000_000)
    text = re.sub(r"[ \t]+\n", "\n", text)
    print(f"held-out text: {len(text) / 1e6:.1f} M characters; characters per token: word-level "
          f"{chars_per_token(word, text):.2f}, BPE {chars_per_token(bpe, text):.2f}")
    unk = word.encode(text[:400_000]).ids
    print(f"word-level [UNK] share on held-out text: {100 * np.mean(np.asarray(unk) == 0):.1f} %")

    print("\nencode, CPU microseconds per prompt token (median of 3 prompts, each timed >= 5 times):")
    enc = {"word-level": encode_costs(word, text), "BPE": encode_costs(bpe, text)}
    print(f"  {'prompt tokens':>13}  {'word-level':>17}  {'BPE':>17}  {'BPE/word':>8}")
    print(f"  {'':>13}  {'median (least)':>17}  {'median (least)':>17}  {'(median)':>8}")
    for n in PROMPT_LENS:
        (w, wl), (b, bl) = enc["word-level"][n], enc["BPE"][n]
        print(f"  {n:>13,}  {w:>8.3f} ({wl:>6.3f})  {b:>8.3f} ({bl:>6.3f})  {b / w:>8.2f}")

    print(f"\nincremental detokenisation, CPU microseconds per output token ({OUTPUT_LEN}-token "
          f"outputs after a 1,000-token prompt, median of 5):")
    det = {"word-level": detok_costs(word, text),
           "word+WP": detok_costs(with_wordpiece_decoder(word), text),
           "BPE": detok_costs(bpe, text)}
    print(f"  {'method':>22}  {'word-level':>10}  {'word-level+WordPiece':>20}  {'BPE':>6}  "
          f"{'BPE/word':>8}")
    for k, label in (("stream", "DecodeStream.step"), ("window", "sliding-window decode")):
        w, wp, b = det["word-level"][k], det["word+WP"][k], det["BPE"][k]
        print(f"  {label:>22}  {w:>10.3f}  {wp:>20.3f}  {b:>6.3f}  {b / w:>8.2f}")
    print(f"\nload after: {uptime()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
