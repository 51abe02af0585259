#!/usr/bin/env bash
# Build the payload that carries SGLang 0.5.17 and the kernels its Engine path imports to a GPU
# machine that cannot download (benchmarks/sglang_device_plan.py --step setup unpacks it there).
# Run from the repository root; everything lands in .sglang/ (git-ignored).
#
# Wheels: wheels.lock (SGLang's own set) plus, at the vLLM payload's pinned versions and hashes,
# the pure-Python serving deps the device image lacks (SHARED below, read from
# simserve/realcheck/vllm_payload/wheels.lock). Every wheel is unpacked into one site folder,
# trimmed of what a dense Llama/Qwen model on one Hopper GPU never loads, xz-compressed and
# split into parts of PART_BYTES, each carried by one device call beside the working tree.
# Trimmed: sglang's multimodal generation and test packages and its three Rust extensions
# (HTTP server, gRPC, image preprocessing: the Engine path uses none); sgl_kernel's Blackwell
# build (sm100), FlashMLA and InfLLM extensions (loaded lazily, only by MLA / sparse models).
# Kept: sgl_kernel's FA3 build (flash_ops, SGLang's default attention backend on Hopper),
# flashinfer's JIT sources (its sampling kernels compile on first use with the image's nvcc).
# Not carried (stubs under .sglang/site): xgrammar (structured outputs; protocol.py already
# falls back when it is missing, the stub keeps function_call imports working) and IPython
# (sglang.utils imports IPython.display for notebooks only).
# Check afterwards: `python benchmarks/sglang_payload/import_closure.py` (every module-level
# import on the Engine path is in the payload or the device image).
# Needs pip, unzip, xz, split, sha256sum. Prints the part count and sizes.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PIP=${PIP:-python3 -m pip}
PART_BYTES=${PART_BYTES:-34000000}
XZ_LEVEL=${XZ_LEVEL:--9}
W=.sglang/build
SITE=.sglang/site
SHARED="pydantic pydantic_core annotated_types typing_inspection fastapi starlette uvicorn msgspec
 pyzmq pybase64 setproctitle partial_json_parser gguf dill sniffio jiter opentelemetry_api"
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp \
 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 \
 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
 --platform manylinux1_x86_64 --platform linux_x86_64 --platform any"
mkdir -p "$W/whl"
lock() {  # the lines to fetch: file sha
  grep -v '^#' "$HERE/wheels.lock"
  for n in $SHARED; do
    awk -v n="$n" '{split($2, a, "-"); if (a[1] == n) print $2, $3}' \
      "$HERE/../../simserve/realcheck/vllm_payload/wheels.lock"
  done
}
lock | while read -r file sha; do
  name=$(echo "$file" | cut -d- -f1); ver=$(echo "$file" | cut -d- -f2)
  [ -f "$W/whl/$file" ] || $PIP download -q --no-deps $PLAT -d "$W/whl" "$name==$ver"
  echo "$sha  $W/whl/$file" | sha256sum -c --quiet -
done
[ "$(lock | wc -l)" -eq "$(ls "$W"/whl/*.whl | wc -l)" ] || { echo "wheel count differs from the lock" >&2; exit 1; }
du -cb "$W"/whl/*.whl | tail -1 | sed 's/total/bytes of wheels/'
rm -rf "$SITE" && mkdir -p "$SITE"
for f in "$W"/whl/*.whl; do unzip -q -o "$f" -d "$SITE"; done
rm -rf "$SITE"/sglang/multimodal_gen "$SITE"/sglang/test "$SITE"/sgl_kernel/sm100 \
       "$SITE"/sglang/srt/server/_core.*.so "$SITE"/sglang/srt/grpc/_core.*.so \
       "$SITE"/sglang/srt/multimodal/_core.*.so "$SITE"/sgl_kernel/flashmla_ops.abi3.so \
       "$SITE"/sgl_kernel/infllm_ops.*.so
find "$SITE" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p "$SITE/xgrammar" "$SITE/IPython"
# the vLLM payload's xgrammar stub, plus StructuralTag as a typing alias (SGLang's pydantic
# models name it in annotations; an empty class there would not validate)
cp "$HERE/../../simserve/realcheck/vllm_payload/xgrammar_stub.py" "$SITE/xgrammar/__init__.py"
printf '\nfrom typing import Any\nStructuralTag = Any\n' >> "$SITE/xgrammar/__init__.py"
cp "$HERE/stubs/ipython_display.py" "$SITE/IPython/display.py"
: > "$SITE/IPython/__init__.py"
du -sb "$SITE" | sed 's/\t.*/ bytes unpacked/'
(cd "$SITE" && tar cf - .) | xz $XZ_LEVEL -T0 > "$W/site.tar.xz"
rm -rf .sglang/p[0-9]*
split -b "$PART_BYTES" -d -a 2 "$W/site.tar.xz" "$W/site.tar.xz."
i=1; for f in "$W"/site.tar.xz.[0-9][0-9]; do mkdir -p .sglang/p$i; mv "$f" .sglang/p$i/; i=$((i+1)); done
sha256sum "$W/site.tar.xz" | cut -d' ' -f1 > .sglang/site.sha256
ls -d .sglang/p[0-9]* | wc -l | sed 's/$/ parts/'
du -sb .sglang/p[0-9]*
