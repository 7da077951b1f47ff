#!/usr/bin/env bash
# Correctness on a GPU host; run from the repository root:
#
#   bash benchmarks/gpu_check.sh [--out DIR] [--wheels DIR] [--library FILE] [STEP ...]
#
# STEP: tests (the whole suite, default), kernels (the CUDA kernel and sinks tests), frontends
# (torchax and JAX tests), examples (the example in every mode this host has), serving
# (transformers' continuous batching on our ops beside its own, bf16, 32 requests: tok/s and the
# steps whose token eager attention also picks from the same history), sanitizer
# (compute-sanitizer memcheck and racecheck on a reduced kernel selection), timing (`python -m
# benchmarks probe decode`).
# Needs python3 with torch, jax (CUDA) and pytest; the library (`nox -s build`, or --library).
# --wheels DIR (default .whl): every *.whl there (e.g. torchax) is installed without dependencies
# into a temporary directory. DIR (default artifacts/gpu-check/<UTC time>) receives one log per
# step and device.txt; the last lines printed are the summary.
set -uo pipefail
out="" wheels=".whl" library="" steps=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --out) out=$2; shift ;;
    --wheels) wheels=$2; shift ;;
    --library) library=$2; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option $1" >&2; exit 2 ;;
    *) steps+=("$1") ;;
  esac
  shift
done
[[ ${#steps[@]} -gt 0 ]] || steps=(tests)
out=${out:-artifacts/gpu-check/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
# torch (eager CUDA) and jax share the GPU in one process: no 75 % preallocation by jax
export XLA_PYTHON_CLIENT_PREALLOCATE=false
# pytest workers (-n: one per core, at most 16 CUDA contexts on the GPU) split the host's cores:
# one CPU thread each for the references. With torch's default of a thread per core in each of 16
# workers, the kernel tests were 581 of 582 done after 530 s; with one, the whole suite took 164 s.
workers=$(nproc 2> /dev/null || echo 8)
(( workers <= 16 )) || workers=16
PARALLEL=(env "OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}")
if [[ -n $library ]]; then
  export XLA_GPU_OPS_LIBRARY=$(cd "$(dirname "$library")" && pwd)/$(basename "$library")
fi
if compgen -G "$wheels/*.whl" > /dev/null; then
  site=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheels"/*.whl 2>&1 | tail -3
  export PYTHONPATH="$PYTHONPATH:$site"
fi
{
  date -u +%FT%TZ
  # a copy without .git (or with a stale one) names its commit in XLA_GPU_OPS_GIT_COMMIT
  echo "commit ${XLA_GPU_OPS_GIT_COMMIT:-$(git rev-parse HEAD 2> /dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import importlib.util as u, torch, jax; print('torch', torch.__version__, 'jax', \
jax.__version__, jax.devices(), 'torchax', 'present' if u.find_spec('torchax') else 'absent')"
} 2>&1 | tee "$out/device.txt"

# -v: one line per test as it ends, so a run stopped by its time limit still names its failures;
# -rfEs: the end summary lists failures and errors as well as skips (-rs alone hides them).
PYTEST=(python3 -m pytest -v -rfEs -p no:cacheprovider -p no:benchmark)
# CPU-only files: container lint (needs hadolint), the torch_xla 2.7 stack, the bench smoke run
NOT_GPU=(--ignore=tests/test_bench_smoke.py --ignore=tests/test_container_lint.py
  --ignore=tests/test_xla_cuda_stack.py)
SANITIZED="(dtypes_head_dims and not 32 and not 80 and not 96 and not 192) or bad_sequence"
SANITIZED+=" or bad_num_seqs or empty_sequences or simple_add_matches"
SANITIZED+=" or short_sequences_window or bad_short_sequence or (large_prefill_batch and 2000)"
SANITIZED+=" or (sm90_and_mma_prefill_kernels_agree and (128 or 160)) or whole_page_reads"
SANITIZED+=" or (fp8_cache_dtypes_head_dims and bfloat16) or bad_sequence_with_fp8_or_sinks"
SANITIZED+=" or split_parts_weigh"  # every writer of KV split parts, and both merges
SANITIZED+=" or persistent_blocks_poison"  # poisoned items among persistent sm_90a items
SANITIZED+=" or (fp8_cache_prefill_tile_edges and 64 and 12) or (fp8_cache_short_sequences and 2000)"
SANITIZED+=" or (head_dim_256_tiles and 12-4) or head_dim_256_bad_page"  # 32-key D = 256 decode tiles
# the KV-cache write kernel (with a slot past the cache) and the scales, from the serving tests
SANITIZED_SERVING="cuda_cache_write or cuda_attention_scales"
# every kernel path's LSE and the split-keys merge; scales read as tensors; separate K and V
# caches; each op of the table on CUDA (torch and the JAX handlers), rms_norm and the merge
SANITIZED_OUTPUTS=(tests/test_paged_attention_lse.py tests/test_scales.py tests/test_layouts.py
  tests/test_every_op.py tests/test_rms_norm.py tests/test_merge_attention_states.py -k cuda)
summary=()
for step in "${steps[@]}"; do
  case $step in
    tests) timeout 900 "${PARALLEL[@]}" "${PYTEST[@]}" --durations=25 tests/ "${NOT_GPU[@]}" -n "$workers" > "$out/tests.txt" 2>&1 ;;
    kernels) timeout 300 "${PARALLEL[@]}" "${PYTEST[@]}" tests/test_kernels_cuda.py tests/test_sinks.py -n "$workers" > "$out/kernels.txt" 2>&1 ;;
    frontends) timeout 300 "${PARALLEL[@]}" "${PYTEST[@]}" -m "torchax or jax" tests/ -n 4 > "$out/frontends.txt" 2>&1 ;;
    examples)
      : > "$out/examples.txt"
      ok=0
      for args in "--dtype float32" "--dtype bfloat16 --sliding-window 7 --soft-cap 3"; do
        # shellcheck disable=SC2086  # one string of options per run
        timeout 120 python3 examples/xla_gpu_attention.py --mode all $args >> "$out/examples.txt" 2>&1 || ok=1
      done
      (exit $ok) ;;
    sanitizer)
      # the two tools run side by side (each is bound by the host's instrumentation work)
      sanitize() {
        local rc=0
        timeout 360 compute-sanitizer --tool "$1" --error-exitcode 99 --print-limit 20 \
          "${PYTEST[@]}" tests/test_kernels_cuda.py -k "$SANITIZED" > "$out/sanitizer-$1.txt" 2>&1 || rc=1
        timeout 150 compute-sanitizer --tool "$1" --error-exitcode 99 --print-limit 20 \
          "${PYTEST[@]}" tests/test_serving.py -k "$SANITIZED_SERVING" >> "$out/sanitizer-$1.txt" 2>&1 || rc=1
        timeout 240 compute-sanitizer --tool "$1" --error-exitcode 99 --print-limit 20 \
          "${PYTEST[@]}" "${SANITIZED_OUTPUTS[@]}" >> "$out/sanitizer-$1.txt" 2>&1 || rc=1
        return $rc
      }
      sanitize memcheck & memcheck=$!
      sanitize racecheck & racecheck=$!
      ok=0
      wait $memcheck || ok=1
      wait $racecheck || ok=1
      (exit $ok) ;;
    serving)
      timeout 600 python3 examples/serve_transformers.py --device cuda --dtype bfloat16 \
        --size medium --requests 32 --new-tokens 64 --check --compare "paged|sdpa" sdpa \
        > "$out/serving.txt" 2>&1 ;;
    timing) timeout 300 python3 -m benchmarks probe decode > "$out/timing.txt" 2>&1 ;;
    *) echo "gpu_check.sh: unknown step $step" >&2; false ;;
  esac
  rc=$?
  summary+=("$step: exit status $rc")
  for f in "$out/$step"*.txt; do [[ -f $f ]] && tail -3 "$f" | sed "s|^|  $(basename "$f"): |"; done
done
echo
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
! grep -q "status [1-9]" "$out/summary.txt"
