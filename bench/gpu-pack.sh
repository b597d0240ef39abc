#!/bin/sh
# bench/gpu-pack.sh — packs what a GPU run needs into a git-ignored folder of the
# checkout (default .gpu/), for the device tool (bench/RESULTS.md's GPU sections):
# builds for sm_90, copies the programs, the CUDA tests and the GPU benches,
# collects the shared libraries the device image lacks (nng, cJSON: the CEO's
# ../shared/gpu/carry-libs; cuBLAS, cudart and NCCL are in the image) and packs
# the binaries into one tar compressed by zstd with a long window (the carried tree is
# limited to 64 MiB; the binaries, ~30 MB each with every kernel in it, come to ~400 MB
# unpacked and ~87 MB as a gzip'd tar since step.cu, but they are one copy of the kernels
# many times over, which a 1 GiB window finds: ~6 MB).  zstd's program is carried too, in
# case the device image has only the library.
# The PyTorch references are copied from ../shared/bench (which does not travel).
#   sh bench/gpu-pack.sh [DIR]      then, with the device tool:
#   run(command="bash bench/gpu-device.sh all", carry=[".gpu"])
set -eu
G=${1:-.gpu}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# the CEO's shared folder beside the main checkout (also from a git worktree elsewhere)
SH=${SHARED:-$(cd "$(git rev-parse --git-common-dir)/../.." && pwd)/shared}
ex=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$ex")"
grep -qx "/$G/" "$ex" 2>/dev/null || git check-ignore -q "$G" || echo "/$G/" >> "$ex"
make -j2 CUDA_ARCH=90 all tests-build > "$G.build.log" 2>&1 || { tail -30 "$G.build.log"; exit 1; }
rm -rf "$G/build" "$G/libs"
mkdir -p "$G/build/bin" "$G/build/tests" "$G/build/bench" "$G/ref"
cp build/bin/rl-* "$G/build/bin/"
cp build/tests/test_cuda_* build/tests/test_comm_cuda build/tests/test_wsync_cuda "$G/build/tests/"
for b in gpu_kernels gpu_train gpu_gen gpu_engine gpu_ew wgroup; do cp "build/bench/$b" "$G/build/bench/"; done
"$SH/gpu/carry-libs" "$G/libs" "$G"/build/bin/* "$G"/build/tests/* "$G"/build/bench/*
rm -f "$G"/libs/libcublas* "$G"/libs/libcudart* "$G"/libs/libnccl*
strip -g "$G"/build/*/*
cp "$SH"/bench/*.py "$G/ref/" 2>/dev/null || echo "gpu-pack: no $SH/bench/*.py (PyTorch references)" >&2
rm -f "$G/pack.tgz"
tar cf - -C "$G" build | zstd -q -12 --long=30 -T0 -f -o "$G/pack.tar.zst"
cp "$(command -v zstd)" "$G/libs/zstd"
rm -rf "$G/build" "$G.build.log"
du -sh "$G/pack.tar.zst" "$G/libs"
