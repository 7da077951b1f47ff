"""FlashInfer as a peer over our cache: batch decode (tensor cores), XQA decode, batch prefill (FA3 on
sm_90), their fp8-cache and attention-sink forms.

Same inputs, same process. Our cache is [pages, page_size, 2*Hkv, D] with K at even and V at odd
combined heads; FlashInfer takes K and V caches [pages, page_size, Hkv, D] ("NHD") and reads their
strides, so K and V are strided views of our cache: the same bytes, no copy. Its CSR page metadata
(indptr, indices, last_page_len) is derived once from block_tables and context_lens; XQA reads
block_tables and context_lens as they are. `plan()` runs on the host, outside the timed region:
FlashInfer schedules from the lengths on the host (ours has no host plan; inside an XLA program
nothing runs on the host); XQA has no plan. Causal masks agree: FlashInfer aligns a request's
queries with the end of its keys (key j visible to query i if j <= i + kv_len - q_len), as ours
does. Outputs go to preallocated buffers (`out=`, as serving frameworks call it).

Peers (FlashInfer 0.6.13, read from its wheel):
  flashinfer_decode   BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True): FlashInfer's FA2
                      prefill template with a KV head's query heads as the rows; an fp8 cache
                      through plan(kv_data_type=float8_e4m3fn) and run(k_scale=, v_scale=). One
                      query token per request: its tensor-core path plans qo_indptr = arange and
                      runs without a causal mask (plan's q_len_per_req reaches only its
                      trtllm-gen and cute-dsl backends), so it sits out the spec_decode rows
  flashinfer_xqa      flashinfer.decode.xqa_batch_decode_with_kv_cache: XQA, vLLM's decode kernel
                      on Hopper (fp8 cache, sliding window and sinks in the kernel); on spec_decode
                      rows its speculative-decoding form: q_len_per_req and a causal mask over the
                      new tokens (xqa_spec_mask), q_len compiled into its module
  flashinfer_prefill  BatchPrefillWithPagedKVCacheWrapper, causal: FA3 on sm_90, FA2 for an fp8
                      cache (prefill_backend); also the spec_decode rows (ragged qo_indptr)
Sinks: FlashInfer's sink variant, BatchAttentionWithAttentionSinkWrapper (a prefill wrapper with a
JIT module of its own; run(q, kv, sinks, sm_scale)), serves the decode and prefill peers; the
decode wrapper's run(sinks=) reaches only the trtllm-gen backend (sm_100) and the FA2 / FA3
paged_run drop it (prefill.py). Sliding window: window_left.

FlashInfer 0.6 compiles its kernels on first use (nvcc under CUDA_HOME) into
FLASHINFER_WORKSPACE_BASE. `prebuild` loads or builds every module a run needs before any timing;
`export-cache` packs the built modules into one file; `import-cache` unpacks such a file
into FlashInfer's AOT directory (<package>/data/aot/<module>/<module>.so), where FlashInfer loads a
module without building it (`python -m benchmarks flashinfer {status,prebuild,export-cache,import-cache}`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import json
import os
import re
import sys
import tarfile
import time
from pathlib import Path

from benchmarks.cases import SPEC_DECODE, build_inputs, kv_scales, scale_of
from benchmarks.runners import BenchEnv, NotApplicable, Runner, canon

PIN = "flashinfer-python==0.6.13"
WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended float workspace
# XQA's workspace, zeroed before its first use: 8 MiB of semaphores, then its scratch (512 MiB is
# plenty for the largest batch here)
XQA_WORKSPACE_BYTES = 512 << 20
XQA_PAGE_SIZES = (16, 32, 64, 128)
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


def prefill_backend(case) -> str:
    """FA3 on sm_90 (Hopper), FlashInfer's FA2 template elsewhere. An fp8 cache takes FA2 on every
    GPU: FA3 reads fp8 K/V only with an fp8 query (utils.is_fa3_backend_supported), which would
    change the inputs; FA2 dequantises fp8 K/V against the 16-bit query, as ours does."""
    import torch

    return "fa3" if torch.cuda.get_device_capability()[0] == 9 and not case.kv_fp8 else "fa2"


def window_left(case) -> int:
    """FlashInfer's window: key j is visible to query i if i - j <= window_left (-1: every key).
    Our sliding_window w counts the visible keys, the query's own included (docs/DESIGN.md: key
    position p > pos - w), so window_left = w - 1."""
    return -1 if case.sliding_window is None else case.sliding_window - 1


def _plan_options(case) -> dict:
    """The keywords both wrappers' plan() take: dtypes, softmax scale, window."""
    import torch

    return {
        "q_data_type": getattr(torch, case.dtype),
        "kv_data_type": getattr(torch, case.cache_dtype),
        "sm_scale": scale_of(case),
        "window_left": window_left(case),
    }


def xqa_unsupported(case) -> str | None:
    """Why XQA cannot take the case (None: it can), from FlashInfer 0.6.13's jit/xqa.py and
    decode.py."""
    if case.kind == SPEC_DECODE and not case.uniform:
        return "XQA takes one q_len for every request (q_len_per_req)"
    if case.dtype not in ("float16", "bfloat16"):
        return f"XQA takes float16 or bfloat16 queries, not {case.dtype}"
    if case.page_size not in XQA_PAGE_SIZES:
        return f"XQA takes pages of {' / '.join(map(str, XQA_PAGE_SIZES))} tokens, not {case.page_size}"
    if case.head_dim % 16 or case.head_dim > 256:
        return f"XQA takes a head_dim that is a multiple of 16 up to 256, not {case.head_dim}"
    return None


DECODE_WRAPPER_ONE_QUERY = (
    "BatchDecodeWithPagedKVCacheWrapper's tensor-core path takes one query token per request "
    "(q_len_per_req reaches only its trtllm-gen and cute-dsl backends): flashinfer_prefill runs "
    "this row"
)


def decode_unsupported(case) -> str | None:
    """Why the decode wrapper cannot take the case (None: it can)."""
    return DECODE_WRAPPER_ONE_QUERY if case.kind == SPEC_DECODE else None


def unsupported(impl: str, case) -> str | None:
    """Why `impl` cannot take a case of a kind it is listed for (None: it can)."""
    check = {"flashinfer_xqa": xqa_unsupported, "flashinfer_decode": decode_unsupported}.get(impl)
    return None if check is None else check(case)


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
    """BatchDecodeWithPagedKVCacheWrapper, tensor-core path (use_tensor_cores=True); with sinks,
    the sink variant on the same FA2 template."""
    import torch

    if case.kind not in PEERS["flashinfer_decode"][0]:
        raise NotApplicable("decode batches only (prefill and mixed: flashinfer_prefill)")
    flashinfer = _flashinfer(env)  # first: without FlashInfer, that is the reason on every row
    reason = decode_unsupported(case)
    if reason is not None:
        raise NotApplicable(reason)
    if case.sinks:
        return _prefill_runner(env, case, copies, "fa2")
    indptr, indices, last_page_len = page_metadata(case, copies[0])
    workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=env.device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)
    wrapper.plan(
        indptr,
        indices,
        last_page_len,
        case.num_q_heads,
        case.num_kv_heads,
        case.head_dim,
        case.page_size,
        **_plan_options(case),
    )
    scales = kv_scales(case)

    def run_one(q, kv, out):
        return wrapper.run(q, kv, out=out, **scales)

    return _runner(
        case,
        copies,
        run_one,
        "tensor cores; plan() on the host, untimed; K/V strided views of our cache",
    )


def prepare_prefill(env, case, copies):
    """BatchPrefillWithPagedKVCacheWrapper, causal, backend prefill_backend(case)."""
    if case.kind not in PEERS["flashinfer_prefill"][0]:
        raise NotApplicable(
            "prefill, mixed and spec decode batches only (decode: flashinfer_decode)"
        )
    _flashinfer(env)  # installed, and a GPU to ask for its backend
    return _prefill_runner(env, case, copies, prefill_backend(case))


def _prefill_runner(env, case, copies, backend: str):
    """The prefill wrapper on `backend`, causal; with sinks its sink variant,
    BatchAttentionWithAttentionSinkWrapper, whose run() takes the sinks and the softmax scale."""
    import torch

    flashinfer = _flashinfer(env)
    plan = _plan_options(case)
    indptr, indices, last_page_len = page_metadata(case, copies[0])
    qo_indptr = copies[0]["query_start_loc"].to("cpu")
    workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=env.device)
    scales = kv_scales(case)
    if case.sinks:
        # Its module is named by dtype, window and backend only (attention/_core.py): one head_dim
        # per run's JIT cache. The variant reads its own softmax scale: k_scale goes into it.
        wrapper = flashinfer.BatchAttentionWithAttentionSinkWrapper(
            workspace,
            "NHD",
            backend=backend,
            q_data_type=plan["q_data_type"],
            kv_data_type=plan["kv_data_type"],
            head_dim_qk=case.head_dim,
            head_dim_vo=case.head_dim,
            window_left=plan["window_left"],
        )
        variant_args = (copies[0]["sinks"], plan["sm_scale"] * scales.get("k_scale", 1.0))
    else:
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)
        variant_args = ()
    wrapper.plan(
        qo_indptr,
        indptr,
        indices,
        last_page_len,
        case.num_q_heads,
        case.num_kv_heads,
        case.head_dim,
        case.page_size,
        causal=True,
        **plan,
    )

    def run_one(q, kv, out):
        return wrapper.run(q, kv, *variant_args, out=out, **scales)

    variant = ", sink variant" if case.sinks else ""
    return _runner(
        case,
        copies,
        run_one,
        f"backend {backend}{variant}, causal; plan() on the "
        "host, untimed; K/V strided views of our cache",
    )


def xqa_spec_mask(batch: int, q_len: int, device):
    """XQA's speculative-decoding mask: per request and query row, bit j of 32-bit words (as
    uint16 pairs, [batch, q_len, 2 * ceil(q_len / 32)]) lets the row see new token j; every cached
    key is visible. Causal among the new tokens: row i sees tokens j <= i (FlashInfer's
    tests/attention/test_xqa_batch_decode.py builds the same)."""
    import torch

    words = -(-q_len // 32)
    rows = torch.arange(q_len)
    visible = torch.zeros(q_len, words * 32, dtype=torch.int64)
    visible[:, :q_len] = (rows[None, :] <= rows[:, None]).long()
    packed = (visible.view(q_len, words, 32) << torch.arange(32)).sum(-1)
    packed = packed - (packed >= 2**31).long() * 2**32  # the same 32 bits as int32
    mask = packed.to(torch.int32).expand(batch, q_len, words).contiguous()
    return mask.view(torch.uint16).to(device)


def prepare_xqa(env, case, copies):
    """flashinfer.decode.xqa_batch_decode_with_kv_cache (XQA); no host plan."""
    import torch

    if case.kind not in PEERS["flashinfer_xqa"][0]:
        raise NotApplicable("decode batches only")
    reason = xqa_unsupported(case)
    if reason is not None:
        raise NotApplicable(reason)
    flashinfer = _flashinfer(env)
    if torch.cuda.get_device_capability()[0] not in (9, 10, 12):
        raise NotApplicable("XQA runs on sm_90, sm_100 and sm_120 only (flashinfer/xqa.py)")
    shared = copies[0]  # every copy holds the same page table, lengths and sinks
    workspace = torch.zeros(XQA_WORKSPACE_BYTES, dtype=torch.uint8, device=env.device)
    scales = kv_scales(case)
    # XQA folds the scales into two (csrc/xqa/mha*.cu): logits = q.k x bmm1_scale, and on an fp8
    # cache out = p.v x bmm2_scale (a 16-bit cache ignores bmm2_scale)
    options = {
        "bmm1_scale": scale_of(case) * scales.get("k_scale", 1.0),
        "bmm2_scale": scales.get("v_scale", 1.0),
        "window_left": window_left(case),
        "sinks": shared.get("sinks"),
    }
    form = "XQA"
    if case.kind == SPEC_DECODE:  # its speculative-decoding kernel (SPEC_DEC)
        q_len = case.seqs[0][0]
        options.update(q_len_per_req=q_len, mask=xqa_spec_mask(case.batch, q_len, env.device))
        form = f"XQA spec decoding (q_len_per_req={q_len}, causal mask)"
    longest = max(ctx for _, ctx in case.seqs)

    def run_one(q, kv, out):
        return flashinfer.decode.xqa_batch_decode_with_kv_cache(
            q,
            kv,
            workspace,
            shared["block_tables"],
            shared["context_lens"],
            longest,
            out=out,
            kv_layout="NHD",
            **options,
        )

    return _runner(case, copies, run_one, f"{form}, no host plan; K/V strided views of our cache")


# impl -> (the kinds of case it runs, its prepare): peers.IMPLS lists them, prebuild builds their
# modules. The host-cost case's FlashInfer row is HOST_COST_PEER on its decode (host_cost.py).
PEERS = {
    "flashinfer_decode": (frozenset({"decode", SPEC_DECODE}), prepare_decode),
    "flashinfer_xqa": (frozenset({"decode", SPEC_DECODE}), prepare_xqa),
    "flashinfer_prefill": (frozenset({"prefill", "mixed", SPEC_DECODE}), prepare_prefill),
}
HOST_COST_PEER = "flashinfer_decode"


# ------------------------------------------------------------------------------ JIT modules
def as_run(impl: str, case):
    """The case as `impl` runs it: the host-cost row runs the decode peer on its decode."""
    if case.kind == "host_cost" and impl == HOST_COST_PEER:
        return dataclasses.replace(case, kind="decode")
    return case


def module_key(impl: str, case) -> tuple | None:
    """What picks `impl`'s JIT module for the case; None where `impl` does not run it."""
    kinds, _ = PEERS[impl]
    case = as_run(impl, case)
    if case.kind not in kinds or unsupported(impl, case):
        return None
    key = (
        impl,
        case.dtype,
        case.cache_dtype,
        case.head_dim,
        case.sinks,
        case.sliding_window is not None,
    )
    if impl == "flashinfer_xqa":  # compiled into XQA's kernel too
        key += (case.page_size, case.num_q_heads // case.num_kv_heads)
        if case.kind == SPEC_DECODE:  # and the query tokens per request (gen_xqa_module)
            key += (case.seqs[0][0],)
    return key


def modules_needed(cases, skip_impls=()) -> list[tuple]:
    """(impl, a one-page case) per FlashInfer module the cases will load: running the peer on the
    small case loads the module the timed case will."""
    needed = {}
    for case in cases:
        for impl in PEERS:
            key = module_key(impl, case)
            if key is not None and impl not in skip_impls:
                case = as_run(impl, case)
                # a spec_decode row's q_len is part of XQA's module
                q_len = {"decode": 1, SPEC_DECODE: case.seqs[0][0]}.get(case.kind, case.page_size)
                small = dataclasses.replace(
                    case, name=f"one page of {case.name}", seqs=((q_len, case.page_size),)
                )
                needed.setdefault(key, (impl, small))
    return [needed[key] for key in sorted(needed)]


READY = "ready"  # prebuild's line per module loaded: "ready IMPL CASE ..."
MISSING = "MissingJITCacheError"  # FlashInfer's error for a module it may not build (JIT disabled)


def prebuild(modules: list[tuple], build: bool = True) -> dict:
    """Load (JIT-building where needed) each module by running its peer once on its one-page case.
    Prints one line per module as it becomes ready (READY) or fails, so that a run that stops the
    prebuild knows which peers have their kernels. build=False builds nothing: it places what a
    stopped build linked (place_linked) and loads what is there.

    First each module in turn with FlashInfer's JIT disabled: the cached ones load (one at a time:
    XQA's libraries make CUDA calls while they load), the others say they are missing, and name
    their build (FlashInfer's error carries its JitSpec). Then one ninja run builds every missing
    module at once, on all the host's cores (MAX_JOBS, when unset): the FA3 modules' ten sources
    each and the small modules share the cores to the end, where a build per module left cores
    idle behind the long FA3 ones. The modules it linked go where FlashInfer loads prebuilt ones
    (its AOT directory) and load as the cached ones did. Any module still missing (the shared run
    failed, or a peer needs a second module) builds on its own, concurrently with the others.
    """
    from concurrent.futures import ThreadPoolExecutor

    import torch

    if not modules:
        return {"modules": 0, "seconds": 0.0, "errors": []}
    env = BenchEnv(True)
    start = time.time()
    if not build:
        placed = place_linked()
        _say(
            f"FlashInfer: {len(placed)} modules a stopped build linked, now ready to load"
            + (f": {', '.join(placed)}" if placed else "")
        )
    print(
        f"FlashInfer: {len(modules)} modules: "
        + ", ".join(f"{impl} for {case.name}" for impl, case in modules),
        flush=True,
    )
    builds = {}  # name -> FlashInfer's JitSpec of a missing module

    def load(module, cached_only: bool = False) -> str | None:
        """None when ready (or not applicable), MISSING, or the failure's message."""
        impl, case = module
        label = f"{impl} {case.name.replace(' ', '_')}"
        try:
            PEERS[impl][1](env, case, [build_inputs(case, env.device, seed=0)]).calls[0]()
            torch.cuda.synchronize()  # the call ran to its end on the device, or failed here
        except NotApplicable:  # e.g. XQA on a GPU it does not build for: its rows say so
            _say(f"{READY} {label} not applicable")
            return None
        except Exception as error:
            if cached_only and type(error).__name__ == MISSING:
                spec = getattr(error, "spec", None)
                if spec is not None:
                    builds.setdefault(spec.name, spec)
                _say(f"to build: {label}")
                return MISSING
            message = f"{impl} {case.name}: {type(error).__name__}: {str(error)[-300:]}"
            _say(f"  FAILED {message}")
            return message
        _say(f"{READY} {label} {time.time() - start:.0f} s")
        return None

    def load_cached(group: list) -> list:
        disabled = os.environ.get("FLASHINFER_DISABLE_JIT")
        os.environ["FLASHINFER_DISABLE_JIT"] = "1"
        try:
            return [load(module, cached_only=True) for module in group]
        finally:
            if disabled is None:
                del os.environ["FLASHINFER_DISABLE_JIT"]
            else:
                os.environ["FLASHINFER_DISABLE_JIT"] = disabled

    def split(group: list, outcomes: list) -> tuple[list, list]:
        """(the modules still missing, the failures' messages) of one pass over `group`."""
        still = [m for m, outcome in zip(group, outcomes, strict=True) if outcome == MISSING]
        return still, [outcome for outcome in outcomes if outcome not in (None, MISSING)]

    missing, errors = split(modules, load_cached(modules))
    build_errors = []
    if missing and not build:
        return {
            "modules": len(modules),
            "ready": len(modules) - len(errors) - len(missing),
            "built": 0,
            "seconds": time.time() - start,
            "errors": errors,
        }
    if missing:
        os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 8))
        left = missing
        if builds and _build_together(list(builds.values())):
            # what it made loads as the cached modules did, one at a time
            left, build_errors = split(missing, load_cached(missing))
        if left:  # built one by one: the cores split among those builds, memory bounded
            jobs = max(2, -(-2 * (os.cpu_count() or 8) // len(left)))
            os.environ["MAX_JOBS"] = str(min(jobs, int(os.environ["MAX_JOBS"])))
        with ThreadPoolExecutor(max_workers=max(1, len(left))) as pool:
            build_errors += [e for e in pool.map(load, left) if e]
    return {
        "modules": len(modules),
        "ready": len(modules) - len(errors) - len(build_errors),
        "built": len(missing) - len(build_errors),
        "seconds": time.time() - start,
        "errors": errors + build_errors,
        "max_jobs": os.environ.get("MAX_JOBS"),
    }


def _build_together(specs: list) -> list[str]:
    """Build FlashInfer modules in one ninja run (FlashInfer's own build_jit_specs: a subninja
    per module), then put each one it linked into the AOT directory, where FlashInfer loads a
    module as it is. (Loaded from the JIT directory, a module would go through its own ninja in
    its own directory, whose empty log makes it build again.) Returns the names placed."""
    from flashinfer.jit.core import build_jit_specs

    _, aot_dir = _dirs()

    def place(spec) -> bool:
        return _place(Path(spec.jit_library_path), spec.name, aot_dir)

    placed = [spec.name for spec in specs if place(spec)]  # built before, by a run of its own
    todo = [spec for spec in specs if spec.name not in placed]
    names = ", ".join(spec.name for spec in todo)
    _say(
        f"FlashInfer: building {len(todo)} modules in one ninja run "
        f"(-j {os.environ['MAX_JOBS']}): {names}"
    )
    started = time.time()
    try:
        if todo:
            build_jit_specs(todo, verbose=False)
    except Exception as error:  # a module that failed builds again on its own, and says why
        message = f"{type(error).__name__}: {str(error)[-300:]}"
        _say(f"  the shared build failed after {time.time() - started:.0f} s ({message})")
    placed += [spec.name for spec in todo if place(spec)]
    seconds = time.time() - started
    _say(f"FlashInfer: {len(placed)} of {len(specs)} modules ready to load after {seconds:.0f} s")
    return placed


def _place(so: Path, name: str, aot_dir: Path) -> bool:
    """Copy a module ninja linked into the AOT directory under a temporary name, then rename it:
    a copy cut short never sits where FlashInfer would load it."""
    import shutil

    if not (so.is_file() and _linked(so)):
        return False
    try:
        (aot_dir / name).mkdir(parents=True, exist_ok=True)
        partial = aot_dir / name / f".{so.name}.partial"
        shutil.copy2(so, partial)
        os.replace(partial, aot_dir / name / so.name)
    except OSError as error:  # e.g. a read-only install: the module builds on its own
        _say(f"  {name}: not placed ({error})")
        return False
    return True


def place_linked() -> list[str]:
    """Put each module the JIT directory holds linked but the AOT directory lacks (a shared build
    stopped part way) where FlashInfer loads prebuilt modules; returns their names."""
    jit_dir, aot_dir = _dirs()
    return [
        name
        for name, so in _module_files(jit_dir, linked_only=True)
        if not (aot_dir / name / so.name).exists() and _place(so, name, aot_dir)
    ]


def _module_files(root: Path, linked_only: bool) -> list[tuple[str, Path]]:
    """(name, .so) of each module below root (<name>/<name>.so); linked_only: those a ninja log
    says were linked whole (a JIT directory's)."""
    files = sorted(root.glob("*/*.so")) if root.is_dir() else []
    return [
        (so.parent.name, so)
        for so in files
        if MODULE_FILE.match(f"{so.parent.name}/{so.name}") and (not linked_only or _linked(so))
    ]


def _say(line: str) -> None:
    """One line in one write: the prebuild's threads print beside each other, and a run reads
    its lines back (print writes the text and the newline apart)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _dirs() -> tuple[Path, Path]:
    """(JIT build directory, AOT directory) of the installed FlashInfer."""
    from flashinfer.jit import env as jit_env

    return Path(jit_env.FLASHINFER_JIT_DIR), Path(jit_env.FLASHINFER_AOT_DIR)


def _cuda_arch() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def _linked(so: Path) -> bool:
    """Whether ninja finished linking this JIT-built module: a build log names the .so (the
    module's own, in its build directory, or that of a run that built several modules, in the JIT
    directory above). A build stopped mid-link leaves a partial file behind, which a cache must
    not carry: FlashInfer loads a cached module without building it again."""
    for log in (so.parent / ".ninja_log", so.parent.parent / ".ninja_log"):
        if log.is_file():
            fields = (line.split("\t") for line in log.read_text(errors="replace").splitlines())
            if any(len(f) >= 4 and Path(f[3]).name == so.name for f in fields):
                return True
    return False


def export_cache(dest: Path) -> list[Path]:
    """Pack every built module (JIT-built or imported) into dest (xz tar); parts if it is large."""
    jit_dir, aot_dir = _dirs()
    modules: dict[str, Path] = {}
    for root in (jit_dir, aot_dir):
        for name, path in _module_files(root, linked_only=root == jit_dir):
            modules.setdefault(name, path)
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
            return (
                f"skipped: the cache holds FlashInfer {manifest.get('flashinfer')} modules, "
                f"{version()} is installed"
            )
        if manifest.get("cuda_arch") != _cuda_arch():
            return f"skipped: the cache was built for {manifest.get('cuda_arch')}, this GPU is {_cuda_arch()}"
        members = [m for m in tar.getmembers() if m.isfile() and MODULE_FILE.match(m.name)]
        aot_dir.mkdir(parents=True, exist_ok=True)
        # Python >= 3.11.4 filters members itself; older ones (Debian 12's 3.11.2) get only the
        # plain files whose names MODULE_FILE accepts.
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(aot_dir, members=members, **safe)
    return f"{len(members)} modules into {aot_dir}"
