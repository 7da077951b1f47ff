#!/usr/bin/env bash
# Kernel correctness + quick timings on a GPU machine (the device tool's `run`), from the repo root,
# with xla_gpu_ops/_lib/libxla_gpu_ops.so already built. Writes logs under ${OUT:-/tmp/kernels-out}.
# Usage: benchmarks/device_kernels.sh [tests|timing|sanitize|all]...
set -uo pipefail
OUT=${OUT:-/tmp/kernels-out}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, jax; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'jax', jax.__version__)"
} > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"
status=0
for step in "${@:-all}"; do
  if [[ $step == tests || $step == all ]]; then
    python3 -m pytest tests/test_kernels_cuda.py -q -p no:cacheprovider -n 8 -p no:benchmark 2>&1 | tee "$OUT/pytest.txt" | tail -40 || status=1
  fi
  if [[ $step == timing || $step == all ]]; then
    python3 benchmarks/kernels_timing.py 2>&1 | tee "$OUT/timing.txt" || status=1
  fi
  if [[ $step == sanitize || $step == all ]]; then
    # A reduced run: small shapes that still cover every kernel (prep, mma decode/prefill tiles,
    # fma, split merge, the short region of a large prefill batch and its merge) and the NaN
    # guards. racecheck looks for shared-memory hazards.
    sel="dtypes_head_dims or bad_sequence or bad_num_seqs or empty_sequences or simple_add_matches"
    sel="$sel or short_sequences_window or bad_short_sequence or (large_prefill_batch and 2000)"
    for tool in memcheck racecheck; do
      timeout "${SANITIZE_TIMEOUT:-240}" compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
        python3 -m pytest tests/test_kernels_cuda.py -q -p no:cacheprovider -p no:benchmark -k "$sel" 2>&1 \
        | tee "$OUT/sanitizer-$tool.txt" | tail -6 || status=1
    done
  fi
done
exit $status
