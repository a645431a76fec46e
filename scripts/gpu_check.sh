#!/usr/bin/env bash
# The GPU check, one script for a GPU host that has Python, nvcc, PyTorch and transformers but no network:
# installs verl-sf and its missing dependencies from carried wheels (and bubblewrap from a carried .deb when the
# host has none), starts `verl-sf serve --gpus all --runs-per-gpu 2`, runs scripts/gpu_checks.py (cuda and
# python_gpu through /run_code) and scripts/grpo_step_timing.py (GRPO on the GPU, rewards from that server).
#
#   scripts/gpu_check.sh WHEEL_DIR        # WHEEL_DIR: verl_sf-*.whl, pydantic's wheels, bubblewrap_*.deb, ...
#
# Results go to $OUT (default ./gpu_out): gpu_checks.json, grpo_steps.json, grpo_steps.png, health.json,
# server.log.  Exit status: 0 when every check passed.  Fits in under 8 minutes (docs/performance.md).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
wheels=$(cd "${1:-$here/.whl}" && pwd)
out=${OUT:-$here/gpu_out}
port=${PORT:-8199}
mkdir -p "$out"
say() { echo "== $(date +%T) $*"; }

say "host"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
ls -l /dev/nvidia* 2>&1
ldconfig -p | grep -E "libcuda\.so|libnvidia-ptxjit|libseccomp|libcap\.so|libselinux" | sed 's/^/  /'
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
"$nvcc" --version | tail -2
python3 --version

say "install"
# Into the interpreter's own environment: sandboxes run code with it and none of the server's environment
# (cells import IPython there; a PYTHONPATH would not reach them).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "$wheels"/*.whl || exit 1
command -v bwrap >/dev/null || dpkg -i "$wheels"/bubblewrap_*.deb || exit 1
grep -q 'libseccomp\.so\.2' <(ldconfig -p) || dpkg -i "$wheels"/libseccomp2_*.deb || exit 1
bwrap --version

# What CUDA gets on the host (which also loads nvidia-uvm), then in a bare sandbox with only the GPU's nodes,
# with /sys hidden (as verl-sf's sandbox does) and shown.
say "bare bubblewrap probe"
probe=$(mktemp -d)
cat >"$probe/m.cu" <<'EOF'
#include <cstdio>
#include <cuda_runtime.h>
int main() { size_t f, t; cudaError_t e = cudaMemGetInfo(&f, &t);
  printf("%s free=%zu total=%zu\n", cudaGetErrorName(e), f, t); return e != cudaSuccess; }
EOF
"$nvcc" -o "$probe/m" "$probe/m.cu" && echo "on the host: $("$probe/m" 2>&1)" && for sys in hidden shown; do
  extra=(--tmpfs /sys); [ "$sys" = shown ] && extra=()
  nodes=(); for n in /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia0; do [ -e "$n" ] && nodes+=(--dev-bind "$n" "$n"); done
  echo "/sys $sys: $(bwrap --ro-bind / / --dev /dev "${nodes[@]}" --proc /proc "${extra[@]}" --unshare-pid \
    --unshare-user --unshare-net "$probe/m" 2>&1)"
done

grep -E "^Cap(Eff|Bnd)" /proc/self/status; cat /proc/self/cgroup; uname -r

# The strongest rung first (auto); where this host refuses it, the container rung (landlock), and both logs kept.
server=""
trap '[ -n "$server" ] && kill $server 2>/dev/null; wait 2>/dev/null' EXIT
for isolation in auto landlock; do
  say "serve --isolation $isolation"
  python3 -m verl_sf.cli serve --port "$port" --isolation "$isolation" --gpus all --runs-per-gpu 2 \
    >"$out/server.log" 2>&1 &
  server=$!
  for _ in $(seq 240); do
    grep -q "listening on" "$out/server.log" && break 2
    kill -0 $server 2>/dev/null || break
    sleep 0.5
  done
  grep -E "verl-sf|Error" "$out/server.log" | tail -5
  cp "$out/server.log" "$out/server-$isolation-failed.log"
done
url="http://127.0.0.1:$port"
python3 -c "import json, sys, urllib.request; h = json.load(urllib.request.urlopen(sys.argv[1] + '/health'));
json.dump(h, open(sys.argv[2], 'w'), indent=1); print({k: h[k] for k in ('isolation', 'gpus', 'limits')});
print('cuda' in h['languages'], 'python_gpu' in h['languages'], h['missing_languages'].get('cuda'))" \
  "$url" "$out/health.json" || { tail -30 "$out/server.log"; exit 1; }

say "GPU checks"
python3 "$here/scripts/gpu_checks.py" --sandbox-url "$url" --output-dir "$out"
checks=$?

say "GRPO"
python3 "$here/scripts/grpo_step_timing.py" --sandbox-url "$url" --device cuda --steps 6 --output-dir "$out"
grpo=$?
say "done: checks exit $checks, GRPO exit $grpo"
[ $checks -eq 0 ] && [ $grpo -eq 0 ]
