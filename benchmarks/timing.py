"""How time is measured.

torch (GPU): warm up every input copy, then time `reps` calls that cycle over the copies. By
default the `reps` launches are captured in one CUDA graph and the graph's replays are timed
with CUDA events (that takes the Python/ctypes launch cost out: device time per call); with
`graph=False` the eager loop itself is timed with events (launch cost included when it exceeds
the kernel time). One sample = one replay / loop, divided by `reps`. Before the timed part,
torch's cached memory goes back to the driver and the timer waits until the driver is done with
it (`release_cached_memory`: freed memory slows full-bandwidth kernels for a while).

JAX: one jitted program makes `chain` calls in a row, each call's output feeding the next call's
query (so XLA can neither merge nor hoist them) and each call reading the next input copy. A
sample enqueues `rounds` programs back to back (asynchronous dispatch overlaps the host work with
the device work) and blocks on the last result; wall time / (rounds * chain) is the time per call.
This is wall time, so any per-call gap the runtime leaves on the device is counted, as it should,
but so is each program's fixed cost (dispatch of its arguments, the final sync) spread over its
calls. `time_jax_slope` removes that: it times programs of `chain` and `2 * chain` calls and takes
the difference per extra call (the slope), which is what one more call costs in a long program.
`device_trace` reads the device's own kernel timestamps (jax profiler / CUPTI) around any callable.

CPU (smoke): host clocks around the same loops (there is nothing asynchronous to wait for).

Every timer returns per-call samples in microseconds; statistics are medians and p10–p90.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass
class Timing:
    samples_us: list[float]
    method: str

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples_us)

    def quantile(self, q: float) -> float:
        xs = sorted(self.samples_us)
        if len(xs) == 1:
            return xs[0]
        pos = q * (len(xs) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


# After torch returns freed memory to the driver, kernels that stream at full bandwidth run slow
# for a while: the driver works on the freed pages in the background (H200, measured: a B=32 64k
# decode took 2170 instead of 1918 µs for 20 / 40 / 80 / 180 ms after freeing 8 / 16 / 34 / 68 GiB,
# ~400 GB/s of freed memory; no slowdown after the allocation itself). torch.cuda.graph() empties
# the cache when a capture starts, so a timing right after a large free (a checksum's temporary,
# a peer's layout copy) read 12 % slow until release_cached_memory() waited it out.
FREED_CLEAR_BYTES_PER_S = 250e9  # below the measured ~400 GB/s: a margin
FREED_SETTLE_MIN_BYTES = 256 << 20


def release_cached_memory() -> float:
    """Empty torch's CUDA cache, then wait until the driver is done with what it freed.

    Returns the seconds waited (0 when little was freed).
    """
    import torch

    reserved = torch.cuda.memory_reserved()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    released = reserved - torch.cuda.memory_reserved()
    if released < FREED_SETTLE_MIN_BYTES:
        return 0.0
    wait_s = 0.02 + released / FREED_CLEAR_BYTES_PER_S
    time.sleep(wait_s)
    return wait_s


def _reps_for(per_call_us: float, target_us: float, multiple: int, max_reps: int) -> int:
    reps = max(1, int(target_us / max(per_call_us, 1e-3)))
    reps = max(multiple, (reps // multiple) * multiple)
    return min(reps, max(multiple, max_reps))


def time_torch(
    calls: Sequence[Callable[[], object]],
    *,
    samples: int,
    target_us: float = 2000.0,
    graph: bool = True,
    max_reps: int = 512,
) -> Timing:
    """Per-call time of `calls` (one per input copy), cycled; CUDA events on a GPU."""
    import torch

    if not torch.cuda.is_available():
        return _time_host(calls, samples=samples, target_us=target_us, max_reps=max_reps)
    stream = torch.cuda.current_stream()
    for call in calls:  # warm-up: module load, autotuning, allocator
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    for call in calls:
        call()
    end.record(stream)
    end.synchronize()
    estimate_us = 1000.0 * start.elapsed_time(end) / len(calls)
    reps = _reps_for(estimate_us, target_us, len(calls), max_reps)

    def run_loop() -> None:
        for i in range(reps):
            calls[i % len(calls)]()

    method = "torch eager loop, CUDA events"
    replay: Callable[[], None] = run_loop
    if graph:
        try:
            cuda_graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(stream)
            with torch.cuda.stream(side):  # warm-up on the capture stream, as torch advises
                run_loop()
            stream.wait_stream(side)
            # torch.cuda.graph() empties the cache as it starts: free it here and wait it out
            # (after the warm-up, whose temporaries would otherwise be freed unwaited)
            release_cached_memory()
            # thread_local: a CUDA call of another thread (XLA's runtime shares the process)
            # cannot invalidate the capture. A global-mode capture was invalidated once on an
            # H200, and that worker's heap was corrupted soon after.
            with torch.cuda.graph(cuda_graph, capture_error_mode="thread_local"):
                run_loop()
            cuda_graph.replay()
            torch.cuda.synchronize()
            replay = cuda_graph.replay
            method = "torch CUDA-graph replay, CUDA events"
        except Exception as error:  # capture unsupported by this implementation: time eagerly
            torch.cuda.synchronize()
            method = f"torch eager loop, CUDA events (graph capture failed: {error_text(error)})"
    if replay is run_loop:  # eager timing: the same wait for what earlier work freed
        release_cached_memory()
    out: list[float] = []
    for _ in range(samples):
        start.record(stream)
        replay()
        end.record(stream)
        end.synchronize()
        out.append(1000.0 * start.elapsed_time(end) / reps)
    return Timing(out, f"{method}; {reps} calls per sample over {len(calls)} input copies")


def _time_host(calls, *, samples: int, target_us: float, max_reps: int) -> Timing:
    for call in calls:
        call()
    t0 = time.perf_counter()
    for call in calls:
        call()
    estimate_us = 1e6 * (time.perf_counter() - t0) / len(calls)
    reps = _reps_for(estimate_us, target_us, len(calls), max_reps)
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for i in range(reps):
            calls[i % len(calls)]()
        out.append(1e6 * (time.perf_counter() - t0) / reps)
    return Timing(out, f"host perf_counter loop; {reps} calls per sample over {len(calls)} copies")


def time_host_per_call(call: Callable[[], object], *, samples: int, calls: int = 100) -> Timing:
    """Host time per eager call: `calls` back-to-back calls on the host clock, the sync outside.

    On a tiny shape each kernel ends long before the host issues the next call, so this is what
    the host spends per call (a call that syncs by itself pays its wait too).
    """
    import gc

    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(10):  # warm-up: first-call caches, allocator
        call()
    out = []
    gc.collect()
    gc.disable()  # a collection inside one sample (~0.1 s with torch and jax loaded) is noise
    try:
        for _ in range(samples):
            sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                call()
            t1 = time.perf_counter()
            sync()
            out.append(1e6 * (t1 - t0) / calls)
    finally:
        gc.enable()
    method = f"host clock over {calls} back-to-back eager calls, sync outside the loop, no GC"
    return Timing(out, method)


def time_jax_chain(
    program: Callable,
    first_carry,
    operand_sets: Sequence,
    *,
    chain: int,
    samples: int,
    target_us: float = 20000.0,
    min_rounds: int = 4,
    max_rounds: int = 64,
) -> Timing:
    """Per-call time of a jitted `program(carry, operand_sets) -> carry` making `chain` calls."""
    import jax

    carry = first_carry
    for _ in range(2):  # compile + warm-up
        carry = jax.block_until_ready(program(carry, operand_sets))
    t0 = time.perf_counter()
    carry = jax.block_until_ready(program(carry, operand_sets))
    estimate_us = 1e6 * (time.perf_counter() - t0)
    # Several programs in flight per sample: the first program's dispatch and the final sync
    # (~0.4 ms together on the H200 with jax 0.11) would otherwise be charged to a few calls
    # (seen: 1 program x 8 anchor calls read 197 µs per call where the slope is 147 µs).
    rounds = max(min_rounds, min(max_rounds, int(target_us / max(estimate_us, 1e-3))))
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(rounds):
            carry = program(carry, operand_sets)
        jax.block_until_ready(carry)
        out.append(1e6 * (time.perf_counter() - t0) / (rounds * chain))
    return Timing(out, f"jax wall time, {rounds} programs x {chain} chained calls per sample")


def time_jax_slope(
    make_program: Callable[[int], Callable],
    first_carry,
    operand_sets: Sequence,
    *,
    chain: int,
    samples: int,
    rounds: int = 2,
) -> Timing:
    """Per-call time as the slope between programs of `chain` and `2 * chain` calls (wall time).

    Each sample times `rounds` programs of each length back to back; a program's fixed costs
    (argument handling, launch of the first command, the final sync) cancel in the difference.
    """
    import jax

    short, long = make_program(chain), make_program(2 * chain)
    carry = first_carry
    for program in (short, long, short, long):  # compile + warm-up
        carry = jax.block_until_ready(program(carry, operand_sets))

    def wall(program) -> float:
        nonlocal carry
        t0 = time.perf_counter()
        for _ in range(rounds):
            carry = program(carry, operand_sets)
        jax.block_until_ready(carry)
        return time.perf_counter() - t0

    out = []
    for _ in range(samples):
        t_short, t_long = wall(short), wall(long)
        out.append(1e6 * (t_long - t_short) / (rounds * chain))
    return Timing(
        out,
        f"jax slope: ({rounds} x {2 * chain}-call programs - {rounds} x "
        f"{chain}-call programs) / {rounds * chain} calls, wall time",
    )


def device_trace(run: Callable[[], object], calls: int) -> dict:
    """Device timestamps of every kernel / memcpy / memset that `run()` puts on the GPU.

    Uses the jax profiler (CUPTI sees the whole CUDA context, so torch's launches appear too).
    Returns per-call numbers: `span_us` (first start to last end / calls: device time per call
    including gaps), `busy_us` (summed activity durations / calls) and the activity names, so
    that copies or memsets a runtime inserts show up by name.
    """
    import glob
    import tempfile

    import jax

    with tempfile.TemporaryDirectory(prefix="xgo-trace-") as tmp:
        jax.profiler.start_trace(tmp)
        try:
            run()
        finally:
            jax.profiler.stop_trace()
        paths = glob.glob(f"{tmp}/**/*.xplane.pb", recursive=True)
        if not paths:
            return {"error": "the profiler wrote no .xplane.pb"}
        data = jax.profiler.ProfileData.from_file(paths[0])
    events = []
    for plane in data.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            if not line.name.lower().startswith("stream"):
                continue  # derived lines (XLA Ops, XLA Modules, ...) repeat the same activity
            events += [(e.start_ns, e.end_ns, e.name) for e in line.events]
    if not events:
        return {"error": "no GPU activity in the trace (CUPTI unavailable?)"}
    events.sort()
    names: dict[str, int] = {}
    for _, _, name in events:
        short_name = name.split("(")[0][:80]
        names[short_name] = names.get(short_name, 0) + 1
    span = (max(e[1] for e in events) - events[0][0]) / 1e3
    busy = sum(e[1] - e[0] for e in events) / 1e3
    return {
        "calls": calls,
        "activities": len(events),
        "span_us": span / calls,
        "busy_us": busy / calls,
        "idle_us": (span - busy) / calls,
        "names": dict(sorted(names.items(), key=lambda kv: -kv[1])[:6]),
    }


def error_text(error: BaseException, limit: int = 160) -> str:
    """An exception as one line: its type and message, cut to `limit` characters."""
    text = f"{type(error).__name__}: {error}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
