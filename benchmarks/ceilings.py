"""The device's ceilings, measured in the same process as the cases: read and copy bandwidth,
bf16 matmul rate. Floors and fractions of every case use these numbers."""

from __future__ import annotations

import gc

from benchmarks.timing import release_cached_memory, time_torch


def measure_ceilings(on_gpu: bool, samples: int) -> dict:
    """Read bandwidth (a large sum), copy bandwidth (read + write) and the bf16 matmul rate."""
    import torch

    device = "cuda" if on_gpu else "cpu"
    gen = torch.Generator(device=device).manual_seed(7)

    def timed(make_call) -> object:
        # the buffers live only inside this call, so each measurement frees its own
        return time_torch([make_call()], samples=samples, target_us=20000.0)

    read_elems = (1 << 29) if on_gpu else (1 << 21)  # 2 GiB / 8 MiB of float32

    def make_read():
        x = torch.randn(read_elems, generator=gen, device=device)
        return lambda: x.sum()

    copy_elems = (1 << 28) if on_gpu else (1 << 20)

    def make_copy():  # copy_ of one dtype is a cudaMemcpyAsync (copy engine path)
        src = torch.randn(copy_elems, generator=gen, device=device)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)

    def make_copy_kernel():  # an elementwise kernel that reads one buffer and writes another
        src = torch.randn(copy_elems, generator=gen, device=device)
        dst = torch.empty_like(src)
        return lambda: torch.neg(src, out=dst)

    n = 8192 if on_gpu else 256
    dtype = torch.bfloat16 if on_gpu else torch.float32

    def make_matmul():
        a = torch.randn(n, n, generator=gen, device=device).to(dtype)
        b = torch.randn(n, n, generator=gen, device=device).to(dtype)
        return lambda: a @ b

    read = timed(make_read)
    free_memory(on_gpu)
    copy = timed(make_copy)
    free_memory(on_gpu)
    copy_kernel = timed(make_copy_kernel)
    free_memory(on_gpu)
    matmul = timed(make_matmul)
    free_memory(on_gpu)
    return {
        "read_gbps": 4 * read_elems / read.median_us / 1e3,
        "copy_gbps": 2 * 4 * copy_elems / min(copy.median_us, copy_kernel.median_us) / 1e3,
        "copy_memcpy_gbps": 2 * 4 * copy_elems / copy.median_us / 1e3,
        "copy_kernel_gbps": 2 * 4 * copy_elems / copy_kernel.median_us / 1e3,
        "matmul_tflops": 2 * n**3 / matmul.median_us / 1e6,
        "matmul_dtype": str(dtype).removeprefix("torch."),
        "read_method": f"torch.sum over {4 * read_elems >> 20} MiB float32; {read.method}",
        "copy_method": f"best of copy_ and torch.neg(out=) over {4 * copy_elems >> 20} MiB float32 "
        f"(read + write bytes); {copy.method}",
        "matmul_method": f"{n}x{n} @ {n}x{n}; {matmul.method}",
        "read_spread_us": [read.quantile(0.1), read.quantile(0.9)],
    }


def free_memory(on_gpu: bool) -> None:
    gc.collect()
    if on_gpu:
        release_cached_memory()
