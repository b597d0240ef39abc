#!/bin/sh
# kernels/ptx-same.sh — which kernels a change leaves as they were: compiles kernels/*.cu of
# REV (default HEAD) and of the working tree to PTX for one architecture and compares every
# kernel of REV by name (a kernel that gained a defaulted template parameter is found under
# its new name), with labels, comments, local-depot names and internal-name hashes ignored.  For work
# without a GPU: a kernel whose PTX is unchanged runs as it ran when it was last measured.
#   sh kernels/ptx-same.sh [REV] [ARCH]      (ARCH default 90; nvcc needed)
# Prints, per file, the kernels identical, changed, gone and new; exits 0.
set -eu
rev=${1:-HEAD} arch=${2:-90}
root=$(cd "$(dirname "$0")/.." && pwd)
NVCC=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
mkdir -p "$w/old" "$w/new"
(cd "$root" && git archive "$rev" kernels lib) | tar x -C "$w/old"
cp -r "$root/kernels" "$root/lib" "$w/new/"
for side in old new; do
	for f in "$w/$side"/kernels/*.cu; do
		(cd "$w/$side" && "$NVCC" -O3 -std=c++17 -Ilib -I. --expt-relaxed-constexpr -arch=sm_"$arch" -ptx \
		    "kernels/$(basename "$f")" -o "$(basename "$f" .cu).ptx") &
	done
	wait
done
python3 - "$w" <<'EOF'
import os, re, sys
w = sys.argv[1]
def kernels(path):
    out = {}
    if not os.path.exists(path):
        return out
    s = open(path).read()
    for m in re.finditer(r'\.visible \.entry (\S+)\((.*?)\n\}\n', s, re.S):
        name, body = m.group(1), m.group(0)
        body = re.sub(r'//.*', '', body)
        body = re.sub(r'\$L__\w+', 'L', body)
        body = re.sub(r'__local_depot\d+', 'DEPOT', body)
        body = re.sub(r'_INTERNAL_[0-9a-f]+_', '_INTERNAL_', body)  # a hash of the file's text
        out[name] = body.replace(name, 'NAME')
    return out
for f in sorted(os.listdir(os.path.join(w, 'old'))):
    if not f.endswith('.ptx'):
        continue
    a, b = kernels(os.path.join(w, 'old', f)), kernels(os.path.join(w, 'new', f))
    same, changed, gone = [], [], []
    for k in a:
        # a defaulted template parameter added at the end: I..E..EEv -> I..E..ELi0EEv
        k0 = re.sub(r'^(_Z\d+\w+?I(?:Li-?\d+E)+)Ev', r'\1Li0EEv', k)
        kk = k if k in b else k0 if k0 in b else None
        if kk is None:
            gone.append(k)
        elif a[k] == b[kk]:
            same.append(kk)
        else:
            changed.append(k)
    new = [k for k in b if k not in same and k not in changed]
    print('%s: %d identical, %d changed, %d gone, %d new' % (f[:-4], len(same), len(changed), len(gone), len(new)))
    for k in changed:
        print('  changed', k)
    for k in gone:
        print('  gone   ', k)
EOF
