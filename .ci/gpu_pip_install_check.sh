#!/usr/bin/env bash
# `pip install .` on a GPU host with a named system nvcc, then the installed package (not the
# checkout) runs simple_add and paged_attention on the GPU against the PyTorch reference.
#
#   bash .ci/gpu_pip_install_check.sh [OUT_DIR]
#
# Needs: the host's Python with torch (CUDA) and jax (the XLA FFI headers), nvcc, CMake and Ninja on
# PATH; no network: scikit-build-core, pathspec and packaging come as wheels from .whl/
# (`pip download --no-deps scikit-build-core==1.1.2 pathspec==1.1.1 packaging==26.3 -d .whl`).
# The venv sees the host's packages (--system-site-packages) and is removed afterwards.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-/tmp/xgo-pip-check}"
mkdir -p "$out"
venv="$(mktemp -d)/venv"
trap 'rm -rf "$(dirname "$venv")"' EXIT
python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -q --no-index --find-links "$repo/.whl" scikit-build-core pathspec packaging
started=$SECONDS
XLA_GPU_OPS_NVCC="$(command -v nvcc)" XLA_GPU_OPS_CUDA_ARCHS="${XLA_GPU_OPS_CUDA_ARCHS:-90a}" \
    "$venv/bin/pip" install --no-index --no-build-isolation --no-deps -v "$repo" >"$out/pip-install.log" 2>&1
echo "pip install: $((SECONDS - started)) s, $(grep -c 'Building CUDA object' "$out/pip-install.log") CUDA objects"
cd "$out"  # import the installed package, not the checkout
"$venv/bin/python" - <<'EOF' 2>&1 | tee "$out/check.txt"
import torch
import xla_gpu_ops
from xla_gpu_ops import _library, reference

print("package:", xla_gpu_ops.__file__)
print("library:", _library.library_path())
assert "site-packages" in str(_library.library_path())
a = torch.randn(1000, device="cuda")
b = torch.randn(1000, device="cuda")
assert torch.equal(xla_gpu_ops.simple_add(a, b), a + b)
# decode: 2 sequences, 4 q heads / 2 kv heads, head_dim 64, page 16
torch.manual_seed(0)
q = torch.randn(2, 4, 64, device="cuda")
kv = torch.randn(8, 16, 4, 64, device="cuda")
lens = torch.tensor([20, 37], dtype=torch.int32, device="cuda")
tables = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=torch.int32, device="cuda")
starts = torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda")
num = torch.tensor([2], dtype=torch.int32, device="cuda")
args = (q, kv, lens, tables, starts, num)
out = xla_gpu_ops.paged_attention(*args, scale=0.125)
ref = reference.paged_attention(*(t.cpu() for t in args), scale=0.125)
err = (out.cpu() - ref).abs().max().item()
print(f"simple_add exact; paged_attention max abs error vs reference {err:.2e}")
assert err < 1e-4, err
print("ok: pip install . with a system nvcc runs on the GPU")
EOF
