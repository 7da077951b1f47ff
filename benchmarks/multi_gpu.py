"""Paged attention sharded by KV head on 1, 2, 4 GPUs: weak scaling at fixed heads per GPU.

    python3 -m benchmarks multi-gpu [--out DIR] [--devices 1,2,4] [--budget SECONDS] [--smoke]

Cases, per GPU (N GPUs hold N times the heads, so each GPU does the one-GPU work):
- decode: B 32, context 4096, Hq 32, Hkv 8, D 128, page 16, bf16 (the single-GPU anchor);
- mixed: 4 prefills of 512-2k tokens + 60 decodes over 1k-8k contexts (seeded), same heads;
- the decode with attention sinks (float32 [Hq], split with the query heads), the decode on an
  fp8 (e4m3) cache with k_scale / v_scale, and the mixed batch with both.

For every device count N that `jax.devices()` offers (of 1, 2, 4, 8, or --devices):
- `xla_gpu_ops.sharding.paged_attention` (jax.shard_map, heads on mesh axis "heads") and
  `partitioned_paged_attention` (plain jit of sharded inputs, custom_partitioning);
- outputs against the one-GPU call on the same N-times-the-heads inputs (relative L2, bitwise);
- the compiled program: collectives (there must be none) and the custom call's kv_cache shape
  (one GPU's heads);
- time per call: the slope of jitted chains of k and 2k calls (output -> next query), median
  of samples; throughput in query-head tokens per second and KV bytes read per second;
- verdict for N > 1 on a GPU: throughput >= 0.9 x N x the one-GPU throughput; also the one-GPU
  call on all N x heads (strong-scaling reference);
- the torchax route (`sharding.torchax_paged_attention`) against the JAX output, if torchax
  imports.

NCCL_NVLS_ENABLE=0 is set before jax is imported (NVLink multicast off); the programs have no
collective, so nothing needs NCCL. Writes into DIR (default artifacts/multi-gpu/<UTC time>):
results.json (rows, verdicts, environment), table.md, topology.txt (`nvidia-smi topo -m`),
hlo-decode-<N>gpu.txt (the optimised N-GPU program) and run.log; the compact table prints last.

Without a GPU it runs a smoke on the host devices (XLA_FLAGS=--xla_force_host_platform_device_count=4
gives four): tiny f32 shapes, few samples, the same checks, and no verdict.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import hashlib
import json
import os
import platform
import random
import statistics
import subprocess
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.environment import ROOT, git_commit, package_version

SCALING_TARGET = 0.9  # throughput on N GPUs >= 0.9 x N x one GPU
EQUAL_REL_L2 = {"bfloat16": 1e-2, "float32": 1e-5}  # vs the one-GPU call (the project's tolerances)
FP8_SCALES = {"k_scale": 0.5, "v_scale": 0.25}


@dataclass(frozen=True)
class Case:
    name: str
    seqs: tuple[tuple[int, int], ...]  # (q_len, context_len) per sequence
    num_q_heads: int  # per device
    num_kv_heads: int  # per device
    head_dim: int
    page_size: int
    dtype: str
    sinks: bool = False  # a sinks operand, float32 [Hq]
    kv_dtype: str | None = None  # "float8_e4m3fn": an fp8 cache (with FP8_SCALES); None: dtype

    def attrs(self) -> dict:
        return {"scale": self.head_dim**-0.5, **(FP8_SCALES if self.kv_dtype else {})}


def mixed_seqs(seed: int = 1234, scale: float = 1.0) -> tuple[tuple[int, int], ...]:
    """4 prefills of 512-2k tokens + 60 decodes over 1k-8k contexts, shuffled (seeded);
    `scale` shrinks every length (smoke)."""
    rng = random.Random(seed)
    prefills = [(n, n) for n in (rng.randrange(512, 2049) for _ in range(4))]
    decodes = [(1, rng.randrange(1024, 8193)) for _ in range(60)]
    seqs = prefills + decodes
    rng.shuffle(seqs)
    return tuple((max(1, int(q * scale)), max(1, int(c * scale))) for q, c in seqs)


FP8 = "float8_e4m3fn"
GPU_CASES = (
    Case("decode_B32_ctx4k_h32-8_d128_p16", ((1, 4096),) * 32, 32, 8, 128, 16, "bfloat16"),
    Case("mixed_4prefill_60decode_h32-8_d128_p16", mixed_seqs(), 32, 8, 128, 16, "bfloat16"),
    Case(
        "decode_B32_ctx4k_h32-8_d128_p16-sinks",
        ((1, 4096),) * 32,
        32,
        8,
        128,
        16,
        "bfloat16",
        sinks=True,
    ),
    Case(
        "decode_B32_ctx4k_h32-8_d128_p16-fp8",
        ((1, 4096),) * 32,
        32,
        8,
        128,
        16,
        "bfloat16",
        kv_dtype=FP8,
    ),
    Case(
        "mixed_4prefill_60decode_h32-8_d128_p16-fp8-sinks",
        mixed_seqs(),
        32,
        8,
        128,
        16,
        "bfloat16",
        sinks=True,
        kv_dtype=FP8,
    ),
)
SMOKE_CASES = (
    Case("smoke_decode_B4_ctx64_h4-2_d64_p16", ((1, 64),) * 4, 4, 2, 64, 16, "float32"),
    Case("smoke_mixed_h4-2_d64_p16", mixed_seqs(scale=1 / 64)[:12], 4, 2, 64, 16, "float32"),
    Case(
        "smoke_mixed_h4-2_d64_p16-fp8-sinks",
        mixed_seqs(scale=1 / 64)[:12],
        4,
        2,
        64,
        16,
        "float32",
        sinks=True,
        kv_dtype=FP8,
    ),
)


# ---------------------------------------------------------------------------- environment
def _run(cmd: list[str], timeout: float = 30) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        return (done.stdout + done.stderr).strip()
    except (OSError, subprocess.SubprocessError) as error:
        return f"{cmd[0]}: not available ({error})"


VERSIONED = (
    "jax",
    "jaxlib",
    "jax-cuda12-plugin",
    "jax-cuda12-pjrt",
    "jax-cuda13-plugin",
    "jax-cuda13-pjrt",
    "numpy",
    "ml_dtypes",
    "torch",
    "torchax",
)


def collect_env(jax, on_gpu: bool) -> dict:
    from xla_gpu_ops import _library

    library = _library.library_path()
    env = {
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "versions": {name: package_version(name) for name in VERSIONED if package_version(name)},
        "devices": [
            {"id": d.id, "kind": d.device_kind, "platform": d.platform} for d in jax.devices()
        ],
        "library": {
            "path": str(library),
            "sha256": hashlib.sha256(library.read_bytes()).hexdigest()
            if library.is_file()
            else None,
        },
        "env": {
            k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "XLA_FLAGS", "CUDA_VISIBLE_DEVICES")
        },
    }
    if on_gpu:
        env["nvidia_smi"] = _run(
            [
                "nvidia-smi",
                "--query-gpu=index,name,driver_version,memory.total,"
                "pci.bus_id,clocks.max.sm,clocks.max.mem",
                "--format=csv",
            ]
        )
    return env


# ---------------------------------------------------------------------------- inputs
def make_metadata(case: Case, seed: int) -> dict:
    """Host metadata (numpy): shuffled pages, spare pages no sequence uses."""
    import numpy as np

    rng = np.random.default_rng(seed)
    pages = [-(-ctx // case.page_size) for _, ctx in case.seqs]
    pages_per_seq = max(pages)
    num_pages = sum(pages) + 3
    physical = rng.permutation(num_pages).astype(np.int32)
    block_tables = rng.integers(0, num_pages, (len(case.seqs), pages_per_seq), dtype=np.int32)
    start = 0
    for i, n in enumerate(pages):
        block_tables[i, :n] = physical[start : start + n]
        start += n
    q_lens = [q for q, _ in case.seqs]
    return {
        "num_pages": num_pages,
        "num_tokens": sum(q_lens),
        "context_lens": np.array([c for _, c in case.seqs], np.int32),
        "block_tables": block_tables,
        "query_start_loc": np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32),
        "num_seqs": np.array([len(case.seqs)], np.int32),
    }


def make_inputs(jax, case: Case, num_devices: int, mesh, seed: int) -> list:
    """The operands for N devices' worth of heads, placed as the sharded call wants them; query
    and kv_cache (an fp8 one drawn in dtype, then cast) and sinks are drawn on the devices (no
    host copy of the cache). The sinks operand, where the case has one, comes last."""
    import jax.numpy as jnp

    from xla_gpu_ops import sharding

    meta = make_metadata(case, seed)
    hq, hkv = case.num_q_heads * num_devices, case.num_kv_heads * num_devices
    shapes = {
        "query": (meta["num_tokens"], hq, case.head_dim),
        "kv_cache": (meta["num_pages"], case.page_size, 2 * hkv, case.head_dim),
        "sinks": (hq,),
    }
    dtypes = {"kv_cache": case.kv_dtype or case.dtype, "sinks": "float32"}
    names = ("query", "kv_cache", "context_lens", "block_tables", "query_start_loc", "num_seqs")
    names += ("sinks",) if case.sinks else ()
    shardings = dict(zip(names, sharding.input_shardings(mesh), strict=False))
    key = jax.random.key(seed)
    arrays = []
    for i, name in enumerate(shardings):
        if name in shapes:
            draw = functools.partial(
                jax.random.normal, shape=shapes[name], dtype=jnp.dtype(case.dtype)
            )
            cast = jnp.dtype(dtypes.get(name, case.dtype))
            arrays.append(
                jax.jit(
                    lambda k, draw=draw, cast=cast: draw(k).astype(cast),
                    out_shardings=shardings[name],
                )(jax.random.fold_in(key, i))
            )
        else:
            arrays.append(jax.device_put(meta[name], shardings[name]))
    return arrays


def kv_bytes_read(case: Case, num_devices: int) -> int:
    itemsize = 1 if case.kv_dtype == FP8 else 2 if case.dtype == "bfloat16" else 4
    tokens = sum(c for _, c in case.seqs)
    return tokens * 2 * case.num_kv_heads * num_devices * case.head_dim * itemsize


# ---------------------------------------------------------------------------- measuring
def host_f32(jax, x):
    import numpy as np

    return np.asarray(jax.device_get(x)).astype(np.float32)


def compare(jax, out, expected) -> dict:
    import numpy as np

    a, b = host_f32(jax, out), host_f32(jax, expected)
    rel = float(np.linalg.norm(a - b) / max(float(np.linalg.norm(b)), 1e-30))
    return {
        "rel_l2": rel,
        "max_abs": float(np.max(np.abs(a - b))),
        "bitwise": bool(np.array_equal(a, b)),
        "finite": bool(np.isfinite(a).all()),
    }


def compiled_facts(fn, args) -> tuple[dict, str]:
    from xla_gpu_ops import head_sharding, hlo
    from xla_gpu_ops.ops import PAGED_ATTENTION

    text = fn.lower(*args).compile().as_text()
    facts = {
        "collectives": [f"{c.opcode} {c.shape}" for c in head_sharding.collectives_in_hlo(text)],
        "custom_call_kv": [
            c.operand_shapes[1]
            for c in hlo.custom_calls_in_hlo(text)
            if c.target == PAGED_ATTENTION.ffi_target
        ],
    }
    return facts, text


def time_per_call(jax, step, args, calls: int, samples: int) -> dict:
    """µs per call: the slope between jitted chains of `calls` and 2 x `calls` calls (output ->
    next query), from the medians of their wall times, so dispatch and sync cancel. Where noise
    makes the slope non-positive (a busy host), the longer chain's time per call is used."""
    query, *rest = args

    def chain(n):
        def run(q, *r):
            return jax.lax.fori_loop(0, n, lambda _, x: step(x, *r), q)

        return jax.jit(run)

    short, long = chain(calls), chain(2 * calls)
    for fn in (short, long):  # compile and warm up
        jax.block_until_ready(fn(query, *rest))
    times: dict[str, list[float]] = {"short": [], "long": []}
    for _ in range(samples):
        for name, fn in (("short", short), ("long", long)):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(query, *rest))
            times[name].append(time.perf_counter() - t0)
    short_s, long_s = statistics.median(times["short"]), statistics.median(times["long"])
    slope = (long_s - short_s) / calls * 1e6
    whole = long_s / (2 * calls) * 1e6
    spread = sorted(t / (2 * calls) * 1e6 for t in times["long"])
    return {
        "us": slope if slope > 0 else whole,
        "method": "slope" if slope > 0 else "whole program (slope not positive)",
        "us_slope": slope,
        "us_whole_program": whole,
        "us_whole_p10": spread[len(spread) // 10],
        "us_whole_p90": spread[(len(spread) * 9) // 10],
        "calls": calls,
        "samples": samples,
    }


def run_row(
    jax,
    case: Case,
    num_devices: int,
    *,
    calls: int,
    samples: int,
    seed: int,
    write_hlo: Path | None,
) -> dict:
    import numpy as np
    from jax.sharding import Mesh

    from xla_gpu_ops import jax as xgo_jax
    from xla_gpu_ops import sharding

    devices = jax.devices()[:num_devices]
    mesh = Mesh(np.array(devices), ("heads",))
    attrs = case.attrs()
    args = make_inputs(jax, case, num_devices, mesh, seed)
    row: dict = {
        "case": case.name,
        "devices": num_devices,
        "q_heads": case.num_q_heads * num_devices,
        "kv_heads": case.num_kv_heads * num_devices,
        "tokens": int(args[0].shape[0]),
        "kv_cache_shape": list(args[1].shape),
        "kv_bytes_read": kv_bytes_read(case, num_devices),
    }

    # The one-GPU call on all the heads: the reference output (and strong-scaling time).
    one = [jax.device_put(a, devices[0]) for a in args]
    one_gpu = with_sinks(functools.partial(xgo_jax.paged_attention, **attrs))
    expected = jax.jit(one_gpu)(*one)

    variants = {
        "shard_map": with_sinks(functools.partial(sharding.paged_attention, mesh=mesh, **attrs)),
        "partitioned": with_sinks(functools.partial(sharding.partitioned_paged_attention, **attrs)),
    }
    for name, fn in variants.items():
        try:
            jitted = jax.jit(fn)
            out = jitted(*args)
            facts, text = compiled_facts(jitted, args)
            if write_hlo is not None and name == "shard_map":
                write_hlo.write_text(text)
            row[name] = {
                **compare(jax, out, expected),
                **facts,
                "out_devices": len(out.sharding.device_set),
                "timing": time_per_call(jax, fn, args, calls, samples),
            }
            if name == "shard_map":
                row["torchax"] = torchax_check(jax, mesh, attrs, args, out)
        except Exception as error:
            row[name] = {
                "error": f"{type(error).__name__}: {error}"[:2000],
                "trace": traceback.format_exc()[-3000:],
            }
    if num_devices > 1:
        try:
            # fewer samples: N times the work of a row, for reference only
            timing = time_per_call(jax, one_gpu, one, calls, max(3, samples // 2))
            row["one_gpu_all_heads"] = {"timing": timing}
        except Exception as error:
            row["one_gpu_all_heads"] = {"error": f"{type(error).__name__}: {error}"[:2000]}
    del one, expected, args
    return row


def with_sinks(call):
    """call(*operands): the required six positionally, a seventh (sinks) by keyword."""

    def split(*operands):
        return call(*operands[:6], **({"sinks": operands[6]} if len(operands) > 6 else {}))

    return split


def torchax_check(jax, mesh, attrs: dict, args, jax_out) -> dict:
    """The torchax route on the same sharded inputs: eager torchax tensors in, the same output."""
    try:
        import torchax
    except Exception as error:
        return {"skipped": f"torchax does not import: {type(error).__name__}: {error}"[:300]}
    try:
        from xla_gpu_ops import sharding

        with torchax.default_env():
            tensors = [torchax.interop.torch_view(a) for a in args]
            out = with_sinks(
                functools.partial(sharding.torchax_paged_attention, mesh=mesh, **attrs)
            )(*tensors)
            out = out.jax()
        return {**compare(jax, out, jax_out), "out_devices": len(out.sharding.device_set)}
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"[:2000]}


# ---------------------------------------------------------------------------- verdicts
def throughput(case_row: dict, variant: str) -> float | None:
    timing = case_row.get(variant, {}).get("timing")
    if not timing or not timing["us"] or timing["us"] <= 0:
        return None
    return case_row["tokens"] * case_row["q_heads"] / (timing["us"] * 1e-6)


def judge(rows: list[dict], on_gpu: bool) -> None:
    """Adds per row and variant: throughput, KV bytes/s, checks, and (GPU, N > 1) the scaling
    verdict against the same case on one device."""
    one_device = {r["case"]: r for r in rows if r["devices"] == 1}
    for row in rows:
        tol = EQUAL_REL_L2[row["dtype"]]
        for variant in ("shard_map", "partitioned"):
            entry = row.get(variant)
            if not entry or "error" in entry:
                continue
            tput = throughput(row, variant)
            entry["head_tokens_per_s"] = tput
            entry["kv_bytes_per_s"] = row["kv_bytes_read"] / (entry["timing"]["us"] * 1e-6)
            local_kv = list(row["kv_cache_shape"])
            local_kv[2] //= row["devices"]
            entry["checks"] = {
                "equal_to_one_gpu": entry["finite"] and entry["rel_l2"] <= tol,
                "no_collectives": entry["collectives"] == [],
                "custom_call_on_local_heads": bool(entry["custom_call_kv"])
                and all(
                    s.endswith("[" + ",".join(map(str, local_kv)) + "]")
                    for s in entry["custom_call_kv"]
                ),
                "runs_on_all_devices": entry["out_devices"] == row["devices"],
            }
            base = one_device.get(row["case"], {}).get(variant)
            if not on_gpu:
                entry["verdict"] = None  # a smoke judges nothing
            elif row["devices"] == 1:
                entry["verdict"] = "reference"
            elif base and base.get("head_tokens_per_s") and tput:
                ratio = tput / (row["devices"] * base["head_tokens_per_s"])
                entry["scaling"] = ratio
                entry["verdict"] = "pass" if ratio >= SCALING_TARGET else "FAIL"
            else:
                entry["verdict"] = "no one-device row"


def _torchax_text(row: dict) -> str:
    tx = row.get("torchax")
    if not tx:
        return "–"
    if "skipped" in tx:
        return "not installed"
    if "error" in tx:
        return "error: " + tx["error"][:60]
    return "equal" if tx["bitwise"] else f"rel L2 {tx['rel_l2']:.1e}"


def table(rows: list[dict], on_gpu: bool) -> str:
    lines = [
        "| case | devices | Hq/Hkv total | variant | µs/call | µs/call, whole program (p10-p90) | "
        "one device, all heads µs | "
        "head-tokens/s | KV TB/s | scaling | = one device (rel L2) | collectives | torchax | verdict |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|---|---|---|",
    ]
    for row in rows:
        one = row.get("one_gpu_all_heads", {}).get("timing")
        for variant in ("shard_map", "partitioned"):
            e = row.get(variant)
            if not e:
                continue
            head = f"| {row['case']} | {row['devices']} | {row['q_heads']}/{row['kv_heads']} | {variant} |"
            if "error" in e:
                lines.append(f"{head} failed: {e['error'][:160]} |" + " |" * 9)
                continue
            t, checks = e["timing"], e["checks"]
            equal = "yes" if checks["equal_to_one_gpu"] else "NO"
            equal += f" ({e['rel_l2']:.1e}{', bitwise' if e['bitwise'] else ''})"
            collectives = "none" if checks["no_collectives"] else ", ".join(e["collectives"])[:80]
            verdict = e["verdict"] if e["verdict"] is not None else "not judged (smoke)"
            cells = [
                f"{t['us']:.1f}{'' if t['method'] == 'slope' else '*'}",
                f"{t['us_whole_program']:.1f} ({t['us_whole_p10']:.1f}-{t['us_whole_p90']:.1f})",
                f"{one['us']:.1f}" if one else "–",
                f"{e['head_tokens_per_s']:.3g}",
                f"{e['kv_bytes_per_s'] / 1e12:.3f}",
                f"{e['scaling']:.3f}" if "scaling" in e else "–",
                equal,
                collectives,
                _torchax_text(row) if variant == "shard_map" else "–",
                verdict,
            ]
            lines.append(f"{head} {' | '.join(cells)} |")
    lines += [
        "",
        f"scaling = throughput / (devices x one-device throughput of the same variant); target >= "
        f"{SCALING_TARGET}. µs/call: slope between jitted chains of k and 2k calls (medians); "
        "* = slope not positive (noise), whole-program time used.",
    ]
    if not on_gpu:
        lines.append(
            "CPU smoke on host devices: code paths only; the times mean nothing; no verdict."
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks multi-gpu", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--devices", default=None, help="device counts, e.g. 1,2,4")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds; later rows skip")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes even on a GPU")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    # Before jax (and NCCL) start: NVLink multicast (NVLS) stays off. jax is imported here, after
    # it, and only by this command.
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    import jax

    start = time.monotonic()
    on_gpu = jax.default_backend() == "gpu"
    smoke = args.smoke or not on_gpu
    available = len(jax.devices())
    counts = (
        [int(n) for n in args.devices.split(",")]
        if args.devices
        else [n for n in (1, 2, 4, 8) if n <= available]
    )
    if any(n > available or n < 1 for n in counts):
        parser.error(f"--devices {args.devices}: this host has {available} devices")
    out = args.out or ROOT / "artifacts" / "multi-gpu" / dt.datetime.now(dt.UTC).strftime(
        "%Y%m%dT%H%M%SZ"
    )
    out.mkdir(parents=True, exist_ok=True)
    log_lines: list[str] = []

    def log(text: str) -> None:
        print(text, flush=True)
        log_lines.append(text)

    cases = SMOKE_CASES if smoke else GPU_CASES
    calls, samples = (2, 3) if smoke else (64, 15)
    env = collect_env(jax, on_gpu)
    topology = _run(["nvidia-smi", "topo", "-m"]) if on_gpu else "no GPU: CPU smoke on host devices"
    (out / "topology.txt").write_text(topology + "\n")
    log(
        f"backend {jax.default_backend()}, {available} devices ({env['devices'][0]['kind']}), "
        f"counts {counts}, {'smoke' if smoke else 'full'} run, NCCL_NVLS_ENABLE="
        f"{os.environ['NCCL_NVLS_ENABLE']}"
    )

    rows, skipped = [], []
    for case in cases:
        for n in counts:
            if time.monotonic() - start > args.budget:
                skipped.append(f"{case.name} x{n}")
                continue
            t0 = time.monotonic()
            hlo_file = out / f"hlo-decode-{n}gpu.txt" if n > 1 and case is cases[0] else None
            try:
                row = run_row(
                    jax, case, n, calls=calls, samples=samples, seed=args.seed, write_hlo=hlo_file
                )
            except Exception as error:
                row = {
                    "case": case.name,
                    "devices": n,
                    "error": f"{type(error).__name__}: {error}"[:2000],
                    "trace": traceback.format_exc()[-3000:],
                }
            row["dtype"] = case.dtype
            row["seconds"] = round(time.monotonic() - t0, 1)
            rows.append(row)
            brief = {
                v: row[v]["timing"]["us"]
                for v in ("shard_map", "partitioned")
                if isinstance(row.get(v), dict) and "timing" in row[v]
            }
            log(
                f"{case.name} x{n}: {row['seconds']} s; µs/call "
                + (
                    ", ".join(f"{k} {v:.1f}" for k, v in brief.items())
                    or row.get("error", "failed")
                )
            )

    judge([r for r in rows if "error" not in r], on_gpu)
    result = {
        "env": env,
        "smoke": smoke,
        "cases": [asdict(c) | {"seqs": len(c.seqs)} for c in cases],
        "rows": rows,
        "skipped_for_budget": skipped,
        "target": f"throughput on N GPUs >= {SCALING_TARGET} x N x one GPU (same per-GPU heads)",
        "seconds": round(time.monotonic() - start, 1),
    }
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    text = table([r for r in rows if "error" not in r], on_gpu)
    failed_rows = [f"{r['case']} x{r['devices']}: {r['error']}" for r in rows if "error" in r]
    summary = [
        f"# Multi-device paged attention by KV head ({env['devices'][0]['kind']}, "
        f"{env['date_utc']}, commit {env['git_commit']})",
        "",
        text,
        *(["", "Rows that failed:", *failed_rows] if failed_rows else []),
        *(["", f"Skipped for the budget: {', '.join(skipped)}"] if skipped else []),
        "",
        f"Total {result['seconds']} s. Files in {out}.",
    ]
    (out / "table.md").write_text("\n".join(summary) + "\n")
    for line in summary:
        log(line)
    (out / "run.log").write_text("\n".join(log_lines) + "\n")
    broken = bool(failed_rows) or any(
        not all(row[v]["checks"].values())
        for row in rows
        if "error" not in row
        for v in ("shard_map", "partitioned")
        if "checks" in row.get(v, {})
    )
    return 1 if broken else 0
