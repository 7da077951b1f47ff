"""What an implementation hands the timers (a Runner), and the devices they share (BenchEnv).

An implementation's `prepare(env, case, copies)` returns a Runner, or raises NotApplicable (it
does not cover the case) or any other exception (recorded as "failed: <reason>"; the run goes on).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from benchmarks.timing import error_text


def left_out_reason(skip_impls: Mapping[str, str] | None, impl: str, case_name: str) -> str | None:
    """Why this run leaves `impl` out of the case (workers.left_out: keyed by the impl, or by
    "impl:case" for one case); None when it runs."""
    if not skip_impls:
        return None
    return skip_impls.get(impl) or skip_impls.get(f"{impl}:{case_name}")


class NotApplicable(Exception):
    pass


def prepared(entry: dict, make: Callable[[], Any]) -> Any | None:
    """make()'s result; None after marking the result row `entry` n/a (NotApplicable: the row
    cannot run here) or failed (any other error, shortened)."""
    try:
        return make()
    except NotApplicable as why:
        entry.update(status="n/a", reason=str(why))
    except Exception as error:
        entry.update(status="failed", reason=error_text(error, 300))
    return None


@dataclass
class Runner:
    """What the timers need. torch: `calls`, one per copy. jax: a chained program."""

    framework: str  # "torch" | "jax"
    output: Callable[[], Any]  # canonical output of copy 0: torch float32 CPU tensor
    calls: list[Callable[[], Any]] = field(default_factory=list)
    program: Callable | None = None
    first_carry: Any = None
    operand_sets: Any = None
    chain: int = 0
    graph: bool = True  # torch: capture the calls in a CUDA graph
    notes: str = ""
    compile_for_dump: Callable[[dict], Any] | None = None  # jax: compile with extra options
    make_program: Callable[[int], Callable] | None = None  # jax: the program with n chained calls


class BenchEnv:
    """Devices and lazily imported frameworks shared by every implementation."""

    def __init__(self, on_gpu: bool):
        import torch

        self.on_gpu = on_gpu
        self.device = torch.device("cuda" if on_gpu else "cpu")
        self._jax = None

    @property
    def jax(self):
        if self._jax is None:
            import jax

            self._jax = jax
        return self._jax

    def to_jax(self, tensor):
        import torch

        if tensor.dtype == torch.float8_e4m3fn:  # torch's DLPack export refuses float8 (2.9)
            raw = self.jax.dlpack.from_dlpack(tensor.contiguous().view(torch.uint8))
            return self.jax.lax.bitcast_convert_type(raw, self.jax.numpy.float8_e4m3fn)
        return self.jax.dlpack.from_dlpack(tensor.contiguous())

    def to_torch_cpu(self, array):
        import numpy as np
        import torch

        array = self.jax.device_get(array)
        return torch.from_numpy(np.asarray(array, dtype=np.float32))


def canon(tensor):
    """An output as the checks compare it: float32 on the CPU."""
    return tensor.detach().float().cpu()
