#!/usr/bin/env bash
# FlashAttention-4 onto a lent GPU machine whose calls carry at most 64 MiB each.
#
# The CuTe DSL's compiler library (nvidia-cutlass-dsl-libs-cu13) is a 92 MB wheel. Its two
# large shared objects travel xz-compressed (about 50 + 14 MB), in two halves: .fa4a (the
# first 44 MB of the compiler) and .fa4b (the rest, the runtime, the small wheels, this
# script). Both folders must be ignored by git (.git/info/exclude).
#
#   bash benchmarks/flash4_carry.sh pack            # here, where pip reaches the index
#   call 1, carrying .fa4a:  cp .fa4a/ir.part0 /tmp/ir.part0
#   call 2, carrying .fa4b, on the same warm machine:
#       bash .fa4b/flash4_carry.sh install && export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:src
#
# Elsewhere, `pip install 'sinkscope[flash4]'` is all it takes.
set -euo pipefail
FLASH4=flash-attn-4==4.0.0b36
DSL=4.8.1
LIB=nvidia_cutlass_dsl
IR=$LIB/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so
RUNTIME=$LIB/cu13/lib/libcute_dsl_runtime.so

pack() {
    local work
    work=$(mktemp -d)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 \
        -d "$work" "$FLASH4" "nvidia-cutlass-dsl==$DSL" "nvidia-cutlass-dsl-libs-base==$DSL" \
        "nvidia-cutlass-dsl-libs-core==$DSL" "nvidia-cutlass-dsl-libs-cu13==$DSL" \
        apache-tvm-ffi torch-c-dlpack-ext quack-kernels
    mkdir -p "$work/libs" .fa4a .fa4b
    (cd "$work/libs" && unzip -q "$work"/nvidia_cutlass_dsl_libs_cu13-*.whl)
    xz -T0 -9 -c "$work/libs/$IR" | split -b 44000000 -d -a 1 - "$work/ir.part"
    mv "$work/ir.part0" .fa4a/ && mv "$work/ir.part1" .fa4b/
    xz -T0 -6 -c "$work/libs/$RUNTIME" >.fa4b/runtime.so.xz
    tar -C "$work/libs" -cf .fa4b/cu13-rest.tar --exclude="$(basename "$IR")" --exclude="$(basename "$RUNTIME")" .
    rm "$work"/nvidia_cutlass_dsl_libs_cu13-*.whl
    mv "$work"/*.whl .fa4b/
    cp "$0" .fa4b/flash4_carry.sh
    rm -rf "$work"
    du -sh .fa4a .fa4b
}

install() {
    local site=/tmp/site
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .fa4b/*.whl
    tar -C $site -xf .fa4b/cu13-rest.tar
    cat /tmp/ir.part0 .fa4b/ir.part1 | xz -d >"$site/$IR"
    chmod +x "$site/$IR"
    xz -d -c .fa4b/runtime.so.xz >"$site/$RUNTIME"
    echo "flash-attn-4 installed under $site"
}

"${1:?usage: flash4_carry.sh pack|install}"
