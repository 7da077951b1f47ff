#!/usr/bin/env bash
# Everything GPU in one call on the lent GPU machine (device tool), from the repository root:
#   bash benchmarks/device_all.sh [tests] [examples] [sanitizer] [bench] [bench-quick]
# carry: [".whl", "xla_gpu_ops/_lib/libxla_gpu_ops.so"] (torchax wheel; the library built here).
# The machine has torch + jax but no torch_xla, no torchax and no network; logs go to $OUT.
set -uo pipefail
OUT="${OUT:-/tmp/xgo-device-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# torch (eager CUDA) and jax share the GPU in one process: no 75 % preallocation by jax.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:.
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, jax, importlib.metadata as m; print('torch', torch.__version__, 'jax', \
jax.__version__, 'torchax', m.version('torchax'), jax.devices())"
} 2>&1 | tee "$OUT/device.txt"
# Container lint needs hadolint (not there); the torch_xla 2.7 stack and the bench smoke are CPU work.
PYTEST=(python3 -m pytest -q -rs -p no:cacheprovider -p no:benchmark)
IGNORED=(--ignore=tests/test_bench_smoke.py --ignore=tests/test_container_lint.py
  --ignore=tests/test_xla_cuda_stack.py)
status=0
steps=("$@")
[[ ${#steps[@]} -gt 0 ]] || steps=(tests examples)
for step in "${steps[@]}"; do
  case $step in
    tests) timeout 330 "${PYTEST[@]}" tests/ "${IGNORED[@]}" -n 4 2>&1 | tee "$OUT/pytest.txt" | tail -30 || status=1 ;;
    examples)
      for args in "--dtype float32" "--dtype bfloat16 --sliding-window 7 --soft-cap 3"; do
        timeout 90 python3 examples/xla_gpu_attention.py --mode all $args 2>&1 | grep -v "^WARNING" \
          | tee -a "$OUT/examples.txt" | tail -12 || status=1
      done ;;
    sanitizer) OUT="$OUT" bash benchmarks/device_kernels.sh sanitize || status=1 ;;
    bench) XGO_BENCH_TIME_LIMIT=${XGO_BENCH_TIME_LIMIT:-420} bash benchmarks/device_bench.sh || status=1 ;;
    bench-quick) XGO_BENCH_TIME_LIMIT=${XGO_BENCH_TIME_LIMIT:-150} bash benchmarks/device_bench.sh --quick \
      2>&1 | tail -40 || status=1 ;;
  esac
done
echo "device_all exit status $status" | tee -a "$OUT/device.txt"
exit $status
