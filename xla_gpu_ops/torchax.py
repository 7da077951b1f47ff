"""torchax front end: lowers the torch ops `torch.ops.xla_gpu.*` (xla_gpu_ops._torch_library) to
the JAX binding's call (xla_gpu_ops._jax_ffi, the same `call` as xla_gpu_ops.jax.call).

A PyTorch program running under torchax then emits the same XLA custom calls as a JAX program
(`xla_gpu_<op>`, typed FFI): the CUDA handler on a GPU, the host handler on XLA:CPU.

    import torchax, xla_gpu_ops.torchax
    xla_gpu_ops.torchax.register()        # before torchax.default_env() is first created, or
    env = torchax.default_env()           # register() reloads the default env's op table
    with env:
        out = torch.ops.xla_gpu.paged_attention(q.to("jax"), ...)

torchax copies its global op registry into each Environment when the environment is built, so a
lowering registered later is invisible to an existing environment until `env.load_ops()`;
`register()` does that for the default environment and for any environment passed to it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
import torchax
from torchax.ops import ops_registry

import xla_gpu_ops._torch_library  # noqa: F401  (defines torch.ops.xla_gpu.*)
from xla_gpu_ops import _jax_ffi, ops
from xla_gpu_ops._torchax import store

_register_lock = threading.Lock()


def _make_lowering(op: ops.Op) -> Callable[..., Any]:
    def lowering(*args: Any, **kwargs: Any) -> Any:
        # torchax hands over jax arrays for tensors and plain Python values for the scalars, in
        # the positional/keyword form the caller used; the table binds them.
        operands, attrs = op.bind(args, kwargs)
        return _jax_ffi.call(op, operands, attrs)

    def in_place_lowering(*args: Any, **kwargs: Any) -> None:
        # Ops that write an operand in place get torchax tensors (not jax arrays) and store the
        # aliased result into the operand, as torchax's own copy_ does.
        tensors, attrs = op.bind(args, kwargs)
        outs = _jax_ffi.call(op, [None if t is None else t.jax() for t in tensors], attrs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        for result, operand in op.given_writes(tensors):
            store(tensors[operand], outs[result])

    chosen = in_place_lowering if op.aliases else lowering
    chosen.__name__ = f"{op.name}_lowering"
    return chosen


LOWERINGS: dict[str, Callable[..., Any]] = {op.name: _make_lowering(op) for op in ops.OPS}


def torch_overload(op: ops.Op | str):
    """The `torch.ops.xla_gpu.<op>.default` overload."""
    return getattr(getattr(torch.ops, ops.NAMESPACE), ops.get(op).name).default


def is_registered() -> bool:
    """True when every op's lowering is in torchax's global op registry."""
    return all(
        (entry := ops_registry.all_aten_ops.get(torch_overload(op))) is not None
        and entry.func is LOWERINGS[op.name]
        for op in ops.OPS
    )


def register(*envs: Any) -> None:
    """Register the JAX lowerings of every torch.ops.xla_gpu op with torchax. Idempotent.

    Also reloads the op table of torchax's default environment (if it already exists) and of each
    environment in `envs`, so the lowerings take effect there too.
    """
    with _register_lock:
        for op in ops.OPS:
            lowering = LOWERINGS[op.name]
            overload = torch_overload(op)
            entry = ops_registry.all_aten_ops.get(overload)
            if entry is not None and entry.func is lowering:
                continue  # registering again would only log torchax's duplicate warning
            # is_jax_function: torchax unwraps tensors to jax arrays before the call and wraps
            # the returned array back into a torchax tensor; in-place ops take torchax tensors.
            ops_registry.register_torch_dispatch_op(
                overload, lowering, is_jax_function=not op.aliases, is_view_op=bool(op.aliases)
            )
        for env in (_existing_default_env(), *envs):
            if env is not None:
                env.load_ops()


def _existing_default_env() -> Any:
    """torchax's default environment: the existing one (torchax 0.0.13 from PyPI keeps it in
    `_env`, older builds in `env`; None there until first used), or, where neither attribute
    exists, a newly created one, so the lowerings are never silently missing from it."""
    for name in ("_env", "env"):
        if hasattr(torchax, name):
            return getattr(torchax, name)
    return torchax.default_env()
