#!/usr/bin/env bash
# Build the payload that carries vLLM 0.22.1 and what its serving path imports to a GPU machine
# that cannot download (simserve/realcheck/vllm_campaign.py installs it there). Run from the
# repository root; everything lands in .vllm/ (git-ignored: add `/.vllm/` to .git/info/exclude).
# Wheels are fetched by name and version and checked against wheels.lock (sha256); the vLLM
# wheel is trimmed (FA2, MoE kernels, the Rust frontend and deep_gemm builds for other CPython
# versions removed: Llama/Qwen dense models on Hopper use none of them), xz-compressed and
# split into parts that fit one device call beside the working tree (PART_BYTES).
# Needs a pip new enough for --uploaded-prior-to (>= 25), xz, split, unzip, sha256sum.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PIP=${PIP:-python3 -m pip}
PART_BYTES=${PART_BYTES:-34000000}
XZ_LEVEL=${XZ_LEVEL:--9e}
W=.vllm/build
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp \
 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
 --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
 --platform linux_x86_64 --platform any"
mkdir -p "$W" .vllm/whl .vllm/whl2 .vllm/whl3 .vllm/stub/xgrammar
VLLM_SHA=cc50536c93827a577b2bc45f038b8b866c31ed220631008521a337c9b2558f4d
$PIP download -q --no-deps $PLAT -d "$W" vllm==0.22.1
echo "$VLLM_SHA  $W/vllm-0.22.1-cp38-abi3-manylinux_2_28_x86_64.whl" | sha256sum -c -
# every other wheel: folder, file name (name and version), sha256
while read -r dir file sha; do
  name=$(echo "$file" | cut -d- -f1); ver=$(echo "$file" | cut -d- -f2)
  [ -f ".vllm/$dir/$file" ] || $PIP download -q --no-deps $PLAT -d ".vllm/$dir" "$name==$ver"
  echo "$sha  .vllm/$dir/$file" | sha256sum -c --quiet -
done < "$HERE/wheels.lock"
rm -rf "$W/x" && mkdir -p "$W/x" && (cd "$W/x" && unzip -q ../vllm-0.22.1-cp38-abi3-manylinux_2_28_x86_64.whl)
rm -f "$W"/x/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so "$W"/x/vllm/_moe_C.abi3.so "$W"/x/vllm/vllm-rs \
      "$W"/x/vllm/third_party/deep_gemm/_C.cpython-31[0134]-x86_64-linux-gnu.so
(cd "$W/x" && tar cf - vllm vllm-0.22.1.dist-info) | xz $XZ_LEVEL -T0 > "$W/vllm-trim.tar.xz"
rm -rf .vllm/p[0-9]*
split -b "$PART_BYTES" -d "$W/vllm-trim.tar.xz" "$W/vllm.tar.xz."
i=1; for f in "$W"/vllm.tar.xz.[0-9][0-9]; do mkdir -p .vllm/p$i; mv "$f" .vllm/p$i/; i=$((i+1)); done
cp "$HERE/xgrammar_stub.py" .vllm/stub/xgrammar/__init__.py
du -sb .vllm/p[0-9]* .vllm/whl .vllm/whl2 .vllm/whl3 .vllm/stub
