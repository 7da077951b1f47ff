"""FlashInfer as a peer: batch decode (tensor cores) and batch prefill (FA3 on sm_90) over our cache.

Same inputs, same process. Our cache is [pages, page_size, 2*Hkv, D] with K at even and V at odd
combined heads; FlashInfer takes K and V caches [pages, page_size, Hkv, D] ("NHD") and reads their
strides, so K and V are strided views of our cache: the same bytes, no copy. Its CSR page metadata
(indptr, indices, last_page_len) is derived once from block_tables and context_lens. `plan()` runs
on the host, outside the timed region: FlashInfer schedules from the lengths on the host (ours has
no host plan; inside an XLA program nothing runs on the host). Causal masks agree: FlashInfer aligns
a request's queries with the end of its keys (key j visible to query i if j <= i + kv_len - q_len),
as ours does. Outputs go to preallocated buffers (`out=`, as serving frameworks call it).

FlashInfer 0.6 compiles its kernels on first use (nvcc under CUDA_HOME) into
FLASHINFER_WORKSPACE_BASE. `prebuild` builds every module a run needs, concurrently, before any
timing; `export-cache` packs the built modules into one file; `import-cache` unpacks such a file
into FlashInfer's AOT directory (<package>/data/aot/<module>/<module>.so), where FlashInfer loads a
module without building it (`python -m benchmarks flashinfer {status,prebuild,export-cache,import-cache}`).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import tarfile
import time
from pathlib import Path

from benchmarks.cases import scale_of
from benchmarks.runners import NotApplicable, Runner, canon

PIN = "flashinfer-python==0.6.13"
WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended float workspace
MAX_PART_BYTES = 15 << 20  # a large kernel cache is written in parts of at most this size
MODULE_FILE = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_.-]*)/\1\.so$")  # no "..": stays in its dir


def unavailable() -> str | None:
    """None when flashinfer imports; else why it cannot run (never raises)."""
    if importlib.util.find_spec("flashinfer") is None:
        return f"not installed (optional peer: pip install {PIN})"
    try:
        import flashinfer  # noqa: F401
    except Exception as error:  # a broken install is reported, not raised
        return f"does not import: {type(error).__name__}: {str(error)[:200]}"
    return None


def version() -> str | None:
    try:
        from importlib.metadata import version as dist_version

        return dist_version("flashinfer-python")
    except Exception:
        return None


def prefill_backend() -> str:
    """FA3 on sm_90 (Hopper); FlashInfer's FA2 template elsewhere."""
    import torch

    return "fa3" if torch.cuda.get_device_capability()[0] == 9 else "fa2"


# ------------------------------------------------------------------------------ layout
def page_metadata(case, inputs: dict):
    """FlashInfer's CSR page table (int32 CPU tensors) from our block_tables and context_lens.

    indptr[i]..indptr[i+1] index the pages of sequence i in `indices`; last_page_len[i] is the
    number of used slots of its last page (1..page_size).
    """
    import torch

    lens = inputs["context_lens"].to("cpu", torch.int64)
    tables = inputs["block_tables"].to("cpu", torch.int64)
    page = case.page_size
    pages = (lens + page - 1) // page
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(pages, 0)
    used = torch.arange(tables.shape[1])[None, :] < pages[:, None]
    indices = tables[used]  # row-major: the pages of sequence 0, then 1, ...
    last_page_len = lens - (pages - 1) * page
    return indptr.int(), indices.int(), last_page_len.int()


def kv_views(kv_cache):
    """K and V caches [pages, page_size, Hkv, D] as strided views of our combined cache."""
    return kv_cache[:, :, 0::2], kv_cache[:, :, 1::2]


def _flashinfer(env):
    reason = unavailable()
    if reason is not None:
        raise NotApplicable(reason)
    if not env.on_gpu:
        raise NotApplicable("needs a CUDA GPU")
    import flashinfer

    return flashinfer


def _runner(case, copies, run_one, notes: str):
    import torch

    calls = []
    for c in copies:
        k_cache, v_cache = kv_views(c["kv_cache"])
        out = torch.empty_like(c["query"])
        calls.append(lambda q=c["query"], k=k_cache, v=v_cache, out=out: run_one(q, (k, v), out))
    return Runner("torch", lambda: canon(calls[0]()), calls=calls, notes=notes)


def prepare_decode(env, case, copies):
    """BatchDecodeWithPagedKVCacheWrapper, tensor-core path (use_tensor_cores=True)."""
    import torch

    if case.kind != "decode":
        raise NotApplicable("decode batches only (prefill and mixed: flashinfer_prefill)")
    flashinfer = _flashinfer(env)
    dtype = getattr(torch, case.dtype)
    indptr, indices, last_page_len = page_metadata(case, copies[0])
    workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=env.device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)
    wrapper.plan(indptr, indices, last_page_len, case.num_q_heads, case.num_kv_heads,
                 case.head_dim, case.page_size, q_data_type=dtype, kv_data_type=dtype,
                 sm_scale=scale_of(case))  # fmt: skip

    def run_one(q, kv, out):
        return wrapper.run(q, kv, out=out)

    return _runner(case, copies, run_one, "tensor cores; plan() on the host, untimed; "
                                          "K/V strided views of our cache")  # fmt: skip


def prepare_prefill(env, case, copies):
    """BatchPrefillWithPagedKVCacheWrapper, backend fa3 on sm_90, causal."""
    import torch

    if case.kind not in ("prefill", "mixed"):
        raise NotApplicable("prefill and mixed batches only (decode: flashinfer_decode)")
    flashinfer = _flashinfer(env)
    dtype = getattr(torch, case.dtype)
    backend = prefill_backend()
    indptr, indices, last_page_len = page_metadata(case, copies[0])
    qo_indptr = copies[0]["query_start_loc"].to("cpu")
    workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=env.device)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)
    wrapper.plan(qo_indptr, indptr, indices, last_page_len, case.num_q_heads, case.num_kv_heads,
                 case.head_dim, case.page_size, causal=True, sm_scale=scale_of(case),
                 q_data_type=dtype, kv_data_type=dtype)  # fmt: skip

    def run_one(q, kv, out):
        return wrapper.run(q, kv, out=out)

    return _runner(case, copies, run_one, f"backend {backend}, causal; plan() on the host, "
                                          "untimed; K/V strided views of our cache")  # fmt: skip


# ------------------------------------------------------------------------------ JIT modules
def modules_needed(cases) -> list[tuple[str, str, int]]:
    """(wrapper kind, dtype, head_dim) of every FlashInfer module the cases will load."""
    needed = set()
    for case in cases:
        if case.kind == "decode":
            needed.add(("decode", case.dtype, case.head_dim))
        elif case.kind in ("prefill", "mixed"):
            needed.add(("prefill", case.dtype, case.head_dim))
    return sorted(needed)


def prebuild(modules: list[tuple[str, str, int]]) -> dict:
    """Load (JIT-building where needed) each module by planning a one-page problem; concurrently.

    Each build is its own ninja process; MAX_JOBS (when unset) splits twice the host's cores among
    the builds, so that memory stays bounded while the cores stay busy.
    """
    from concurrent.futures import ThreadPoolExecutor

    import torch

    if not modules:
        return {"modules": 0, "seconds": 0.0, "errors": []}
    os.environ.setdefault("MAX_JOBS", str(max(2, -(-2 * (os.cpu_count() or 8) // len(modules)))))
    import flashinfer

    backend = prefill_backend()

    def load(module) -> str | None:
        kind, dtype_name, head_dim = module
        dtype = getattr(torch, dtype_name)
        workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        indptr = torch.tensor([0, 1], dtype=torch.int32)
        indices = torch.tensor([0], dtype=torch.int32)
        last = torch.tensor([16], dtype=torch.int32)
        try:
            if kind == "decode":
                wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                    workspace, "NHD", use_tensor_cores=True
                )
                wrapper.plan(indptr, indices, last, 8, 8, head_dim, 16, q_data_type=dtype,
                             kv_data_type=dtype)  # fmt: skip
            else:
                wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                    workspace, "NHD", backend=backend
                )
                wrapper.plan(torch.tensor([0, 16], dtype=torch.int32), indptr, indices, last, 8,
                             8, head_dim, 16, causal=True, q_data_type=dtype,
                             kv_data_type=dtype)  # fmt: skip
        except Exception as error:
            return f"{kind} {dtype_name} D{head_dim}: {type(error).__name__}: {str(error)[-300:]}"
        return None

    start = time.time()
    with ThreadPoolExecutor(max_workers=len(modules)) as pool:
        errors = [e for e in pool.map(load, modules) if e]
    torch.cuda.synchronize()
    return {"modules": len(modules), "seconds": time.time() - start, "errors": errors,
            "max_jobs": os.environ["MAX_JOBS"], "prefill_backend": backend}  # fmt: skip


def _dirs() -> tuple[Path, Path]:
    """(JIT build directory, AOT directory) of the installed FlashInfer."""
    from flashinfer.jit import env as jit_env

    return Path(jit_env.FLASHINFER_JIT_DIR), Path(jit_env.FLASHINFER_AOT_DIR)


def _cuda_arch() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def export_cache(dest: Path) -> list[Path]:
    """Pack every built module (JIT-built or imported) into dest (xz tar); parts if it is large."""
    jit_dir, aot_dir = _dirs()
    modules: dict[str, Path] = {}
    for root in (jit_dir, aot_dir):
        for path in sorted(root.glob("*/*.so")) if root.is_dir() else []:
            if MODULE_FILE.match(f"{path.parent.name}/{path.name}"):
                modules.setdefault(path.parent.name, path)
    manifest = {"flashinfer": version(), "cuda_arch": _cuda_arch(), "modules": sorted(modules)}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz", preset=6) as tar:
        data = json.dumps(manifest, indent=1).encode()
        info = tarfile.TarInfo("MANIFEST.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for name, path in sorted(modules.items()):
            tar.add(path, arcname=f"{name}/{name}.so")
    blob = buffer.getvalue()
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in [dest, *dest.parent.glob(dest.name + ".part*")]:
        stale.unlink(missing_ok=True)
    if len(blob) <= MAX_PART_BYTES:
        dest.write_bytes(blob)
        return [dest]
    parts = []
    for index, offset in enumerate(range(0, len(blob), MAX_PART_BYTES)):
        part = dest.with_name(f"{dest.name}.part{index}")
        part.write_bytes(blob[offset : offset + MAX_PART_BYTES])
        parts.append(part)
    return parts


def _read_parts(src: Path) -> bytes:
    src = Path(src)
    if src.is_file():
        return src.read_bytes()
    parts = sorted(
        src.parent.glob(src.name + ".part*"), key=lambda p: int(p.name.rpartition("part")[2])
    )
    if not parts:
        raise FileNotFoundError(f"{src}: no such file, and no {src.name}.part0, .part1, ...")
    return b"".join(p.read_bytes() for p in parts)


def import_cache(src: Path) -> str:
    """Unpack modules packed by export_cache into FlashInfer's AOT directory; says what it did."""
    _, aot_dir = _dirs()
    with tarfile.open(fileobj=io.BytesIO(_read_parts(src)), mode="r:xz") as tar:
        manifest = json.loads(tar.extractfile("MANIFEST.json").read())
        if manifest.get("flashinfer") != version():
            return (f"skipped: the cache holds FlashInfer {manifest.get('flashinfer')} modules, "
                    f"{version()} is installed")  # fmt: skip
        if manifest.get("cuda_arch") != _cuda_arch():
            return f"skipped: the cache was built for {manifest.get('cuda_arch')}, this GPU is {_cuda_arch()}"
        members = [m for m in tar.getmembers() if m.isfile() and MODULE_FILE.match(m.name)]
        aot_dir.mkdir(parents=True, exist_ok=True)
        # Python >= 3.11.4 filters members itself; older ones (Debian 12's 3.11.2) get only the
        # plain files whose names MODULE_FILE accepts.
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(aot_dir, members=members, **safe)
    return f"{len(members)} modules into {aot_dir}"
