#!/usr/bin/env bash
# The whole benchmark on a GPU host, FlashInfer included; run from the repository root:
#
#   bash benchmarks/gpu_bench.sh [--quick] [--out DIR] [--wheels DIR] [--cache-dir DIR]
#        [--flashinfer-cache FILE] [--library FILE] [--budget SECONDS] [--prepare-only]
#        [-- ARGS for python -m benchmarks run]
#
# Needs python3 with torch and jax (CUDA), and the library (`nox -s build`, or --library FILE).
# --wheels DIR (default .whl, wheels carried to a host without network): every *.whl there is
#   installed without dependencies into CACHE/site (flashinfer-python 0.6.13, apache-tvm-ffi,
#   nvidia-ml-py, einops, tabulate, click; torchax); without them FlashInfer's rows say so.
# --cache-dir DIR (default ~/.cache/xla-gpu-ops-bench): the installed wheels and FlashInfer's JIT
#   workspace (FLASHINFER_WORKSPACE_BASE), kept for the next run on the same host.
# --flashinfer-cache FILE: FlashInfer kernels compiled by an earlier run (its
#   flashinfer-jit-cache.tar.xz, or .part0, .part1, ...); default: the newest one in --wheels DIR.
#   Without it FlashInfer first compiles its kernels (minutes).
# --budget SECONDS (default 540, --quick 235): wall time for the whole script; cases past it are
#   skipped and recorded as such.
# --prepare-only: install, import or build FlashInfer's kernels (within the budget), write the
#   cache file of what was built, stop.
# DIR (default artifacts/bench/<UTC time>, git-ignored) receives the run (results.json, table.md,
# plot.png, workers.log), run.log and flashinfer-jit-cache.tar.xz; the table prints last.
# `python -m benchmarks publish DIR` makes the run the record of its GPU kind. The commit comes
# from git, or from XLA_GPU_OPS_GIT_COMMIT where the copy has no .git.
set -uo pipefail
start=$(date +%s)

quick=0 prepare_only=0 out="" wheels=".whl" cache_dir="${HOME:-/tmp}/.cache/xla-gpu-ops-bench"
fi_cache="" library="" budget="" run_args=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --quick) quick=1 ;;
    --prepare-only) prepare_only=1 ;;
    --out) out=$2; shift ;;
    --wheels) wheels=$2; shift ;;
    --cache-dir) cache_dir=$2; shift ;;
    --flashinfer-cache) fi_cache=$2; shift ;;
    --library) library=$2; shift ;;
    --budget) budget=$2; shift ;;
    --) shift; run_args=("$@"); break ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "gpu_bench.sh: unknown argument $1 (--help lists them)" >&2; exit 2 ;;
  esac
  shift
done
[[ -n $budget ]] || budget=$(( quick ? 235 : 540 ))
out=${out:-artifacts/bench/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out" "$cache_dir"
out=$(cd "$out" && pwd) cache_dir=$(cd "$cache_dir" && pwd)
log="$out/run.log"
: > "$log"
say() { echo "$*" | tee -a "$log"; }

export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
# torch and jax share the GPU in one process: no 75 % preallocation by jax
export XLA_PYTHON_CLIENT_PREALLOCATE=false
if [[ -n $library ]]; then
  export XLA_GPU_OPS_LIBRARY=$(cd "$(dirname "$library")" && pwd)/$(basename "$library")
fi
if [[ -z ${XLA_GPU_OPS_GIT_COMMIT:-} ]] && git rev-parse HEAD > /dev/null 2>&1; then
  XLA_GPU_OPS_GIT_COMMIT=$(git rev-parse HEAD)
  [[ -z $(git status --porcelain -- kernels xla_gpu_ops benchmarks) ]] || XLA_GPU_OPS_GIT_COMMIT+="+dirty"
  export XLA_GPU_OPS_GIT_COMMIT
fi
# FlashInfer compiles with nvcc under CUDA_HOME into FLASHINFER_WORKSPACE_BASE
if [[ -z ${CUDA_HOME:-} ]]; then
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then export CUDA_HOME=/usr/local/cuda
  elif command -v nvcc > /dev/null; then CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")"); export CUDA_HOME
  fi
fi
export FLASHINFER_WORKSPACE_BASE="$cache_dir/flashinfer"

{
  echo "== $(date -u +%FT%TZ) commit ${XLA_GPU_OPS_GIT_COMMIT:-unknown} quick=$quick budget=${budget}s"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>&1
  lib=${XLA_GPU_OPS_LIBRARY:-xla_gpu_ops/_lib/libxla_gpu_ops.so}
  if [[ -f $lib ]]; then sha256sum "$lib"; else echo "WARNING: $lib missing: our rows will fail (nox -s build)"; fi
} 2>&1 | tee -a "$log"

# Wheels: installed once per set of wheels (a new set replaces the old one), so FlashInfer's JIT
# workspace stays valid across runs on this host.
site="$cache_dir/site"
if compgen -G "$wheels/*.whl" > /dev/null; then
  stamp=$(ls -l "$wheels"/*.whl | awk '{print $5, $NF}' | sort | sha256sum | cut -c1-16)
  if [[ ! -f $site/.stamp-$stamp ]]; then
    rm -rf "$site"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
      "$wheels"/*.whl 2>&1 | tail -3 | tee -a "$log"
    touch "$site/.stamp-$stamp"
  fi
  export PYTHONPATH="$PYTHONPATH:$site"
fi
python3 -m benchmarks flashinfer status 2>&1 | tee -a "$log"

if [[ -z $fi_cache ]]; then
  fi_cache=$(ls -t "$wheels"/flashinfer-jit-cache*.tar.xz "$wheels"/flashinfer-jit-cache*.tar.xz.part0 \
    2>/dev/null | head -1)
  fi_cache=${fi_cache%.part0}
fi
if [[ -n $fi_cache ]]; then
  python3 -m benchmarks flashinfer import-cache "$fi_cache" 2>&1 | tee -a "$log"
fi
quick_flag=()
(( quick )) && quick_flag=(--quick)

export_cache() {
  python3 -m benchmarks flashinfer export-cache "$out/flashinfer-jit-cache.tar.xz" 2>&1 | tee -a "$log"
}
status=0
if (( prepare_only )); then
  # within the budget, so that what was built is packed for the next run even when some of it
  # is not: past it, the prebuild prints its threads' stacks (USR1) and stops with its compilers
  # (packing xz-compresses every module: allow 90 s)
  left=$(( budget - ($(date +%s) - start) - 90 ))
  (( left > 60 )) || left=60
  timeout --signal=USR1 --kill-after=5 "$left" \
    python3 -m benchmarks flashinfer prebuild "${quick_flag[@]}" 2>&1 | tee -a "$log"
  status=${PIPESTATUS[0]}
  export_cache
else
  # what is left of the budget, less a margin for the case in flight (the longest took 29 s on an
  # H200), the files and the cache file
  left=$(( budget - ($(date +%s) - start) - (quick ? 35 : 60) ))
  (( left > 60 )) || left=60
  # the whole output goes to run.log; the terminal gets progress lines, then the table
  python3 -m benchmarks run "${quick_flag[@]}" --out "$out" --time-limit "$left" --no-progress \
    "${run_args[@]}" 2>&1 | tee -a "$log" \
    | grep -E --line-buffered "^\[[0-9]+/[0-9]+\]|^FlashInfer|^measuring|GB/s, copy|worker|Error|error:"
  status=${PIPESTATUS[0]}
  export_cache
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >> "$log" 2>&1
fi
say "== exit status $status after $(( $(date +%s) - start )) s; files in $out: $(ls "$out" | tr '\n' ' ')"
if [[ -f $out/results.json ]] && (( ! prepare_only )); then
  echo
  python3 -m benchmarks report "$out"
fi
exit "$status"
