# bench/gpu-env.sh — sourced by the device-side scripts (gpu-device.sh, gpu-step.sh,
# gpu-ab.sh) from the checkout's root: G, the folder bench/gpu-pack.sh made (default .gpu);
# its binaries unpacked once (a zstd tar with a 1 GiB window; zstd's program carried in
# libs/ in case the image has none); LD_LIBRARY_PATH with its libraries and CUDA's.
G=${G:-.gpu}
Z=$(command -v zstd || echo "$G/libs/zstd")
if [ ! -d "$G/build" ]; then
	[ -f "$G/pack.tar.zst" ] && "$Z" -q -d --long=30 -c "$G/pack.tar.zst" | tar xf - -C "$G"
	[ -f "$G/pack.tgz" ] && tar xzf "$G/pack.tgz" -C "$G"
fi
L=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH=$PWD/$G/libs:$L${LD_LIBRARY_PATH:-}
export OMP_WAIT_POLICY=passive
