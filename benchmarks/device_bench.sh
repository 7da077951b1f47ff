#!/usr/bin/env bash
# The benchmark on the lent GPU machine (device tool), from the repository root:
#   XLA_GPU_OPS_GIT_COMMIT=<sha> bash benchmarks/device_bench.sh [--quick] [benchmarks.run args]
# carry: [".whl", "xla_gpu_ops/_lib/libxla_gpu_ops.so"]. Installs the carried wheels (torchax),
# runs `python3 -m benchmarks.run --out $OUT/bench`, and leaves 6 files under $OUT/bench
# (results.json, table.md, plot.png, env.json, workers.log, run.log): the tool returns at most 8.
set -uo pipefail

OUT="${OUT:-/tmp/xgo-bench-out}"
mkdir -p "$OUT/bench"
LOG="$OUT/bench/run.log"

export PYTHONUNBUFFERED=1
export PYTHONPATH=.
# The copy on the GPU machine has no .git: the commit must come with the command line, e.g.
#   XLA_GPU_OPS_GIT_COMMIT=$(git rev-parse HEAD) (written out literally in the device call).
if [ -z "${XLA_GPU_OPS_GIT_COMMIT:-}" ] && [ -e .git ]; then
  XLA_GPU_OPS_GIT_COMMIT="$(git rev-parse HEAD 2>/dev/null || true)"
fi
if [ -z "${XLA_GPU_OPS_GIT_COMMIT:-}" ]; then
  echo "WARNING: XLA_GPU_OPS_GIT_COMMIT is not set and there is no .git: results say commit unknown"
fi
export XLA_GPU_OPS_GIT_COMMIT="${XLA_GPU_OPS_GIT_COMMIT:-}"
if compgen -G ".whl/*.whl" > /dev/null; then
  # no network there: the wheels come with the call, without their dependencies
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -3
  export PYTHONPATH=/tmp/site:.
fi
if [ ! -f xla_gpu_ops/_lib/libxla_gpu_ops.so ]; then
  echo "WARNING: xla_gpu_ops/_lib/libxla_gpu_ops.so was not carried: our implementations will fail"
fi

{
  echo "== $(date -u +%FT%TZ) commit=${XLA_GPU_OPS_GIT_COMMIT:-unknown}"
  [ -f xla_gpu_ops/_lib/libxla_gpu_ops.so ] && sha256sum xla_gpu_ops/_lib/libxla_gpu_ops.so
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv 2>&1
} | tee "$LOG"

start=$(date +%s)
python3 -m benchmarks.run --out "$OUT/bench" --time-limit "${XGO_BENCH_TIME_LIMIT:-420}" "$@" 2>&1 | tee -a "$LOG" | grep -v "cases:" 
status=${PIPESTATUS[0]}
echo "== benchmarks.run exit status $status after $(( $(date +%s) - start )) s" | tee -a "$LOG"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>&1 | tee -a "$LOG"
ls -la "$OUT/bench"
exit "$status"
