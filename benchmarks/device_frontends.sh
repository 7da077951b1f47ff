#!/usr/bin/env bash
# torchax and JAX front ends on a GPU machine (the device tool's `run`), from the repo root, with
# xla_gpu_ops/_lib/libxla_gpu_ops.so built and the torchax wheel in .whl/ (carry both: the machine
# has no network and no torchax; see .gitignore). Logs go under ${OUT:-/tmp/frontends-out}.
# Usage: benchmarks/device_frontends.sh [tests|example|all]...
set -uo pipefail
OUT=${OUT:-/tmp/frontends-out}
mkdir -p "$OUT"
# torchax is pure Python; everything it imports (jax, flax, optax, sympy) is already there.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tee "$OUT/pip.txt"
export PYTHONPATH=/tmp/site:.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# torch (eager CUDA) and jax share the GPU in one process: no 75 % preallocation by jax.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, jax, torchax, importlib.metadata as m; print('torch', torch.__version__, \
'jax', jax.__version__, jax.devices(), 'torchax', m.version('torchax'))"
} > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"
status=0
for step in "${@:-all}"; do
  if [[ $step == tests || $step == all ]]; then
    timeout 400 python3 -m pytest -m "torchax or jax" tests/ -q -rs -n 4 -p no:cacheprovider -p no:benchmark \
      2>&1 | tee "$OUT/pytest.txt" | tail -60 || status=1
  fi
  if [[ $step == example || $step == all ]]; then
    # --mode all: every mode this machine has (cpu, cuda, torchax; no torch_xla here).
    for args in "--dtype float32" "--dtype bfloat16" "--dtype bfloat16 --sliding-window 7 --soft-cap 3"; do
      name=example-${args//[ -]/_}
      timeout 120 python3 examples/xla_gpu_attention.py --mode all $args 2>&1 | tee "$OUT/$name.txt" \
        | grep -v "^WARNING" || status=1
    done
  fi
done
echo "exit status $status" | tee "$OUT/status.txt"
exit $status
