"""torchax front end: lowers the torch ops `torch.ops.xla_gpu.*` to `xla_gpu_ops.jax`.

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

from xla_gpu_ops._registry import NAMESPACE, OPS, PAGED_ATTENTION, SIMPLE_ADD, OpSpec

_register_lock = threading.Lock()


def _simple_add_lowering(a: Any, b: Any) -> Any:
    from xla_gpu_ops import jax as xgo_jax

    return xgo_jax.simple_add(a, b)


def _paged_attention_lowering(
    query: Any,
    kv_cache: Any,
    context_lens: Any,
    block_tables: Any,
    query_start_loc: Any,
    num_seqs: Any,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
) -> Any:
    # torchax hands over jax arrays for tensors and plain Python values for the scalars, in the
    # positional/keyword form the caller used; the torch schema already fixed their meaning.
    from xla_gpu_ops import jax as xgo_jax

    return xgo_jax.paged_attention(
        query,
        kv_cache,
        context_lens,
        block_tables,
        query_start_loc,
        num_seqs,
        scale=scale,
        sliding_window=sliding_window,
        soft_cap=soft_cap,
    )


LOWERINGS: dict[OpSpec, Callable[..., Any]] = {
    SIMPLE_ADD: _simple_add_lowering,
    PAGED_ATTENTION: _paged_attention_lowering,
}
assert set(LOWERINGS) == set(OPS), "every op in the op table needs a torchax lowering"


def torch_overload(op: OpSpec):
    """The `torch.ops.xla_gpu.<op>.default` overload (defining the torch ops if needed)."""
    import torch

    import xla_gpu_ops.torch_ops  # noqa: F401  (defines torch.ops.xla_gpu.*)

    return getattr(getattr(torch.ops, NAMESPACE), op.name).default


def is_registered() -> bool:
    """True when every op's lowering is in torchax's global op registry."""
    from torchax.ops import ops_registry

    return all(
        (entry := ops_registry.all_aten_ops.get(torch_overload(op))) is not None
        and entry.func is lowering
        for op, lowering in LOWERINGS.items()
    )


def register(*envs: Any) -> None:
    """Register the JAX lowerings of every torch.ops.xla_gpu op with torchax. Idempotent.

    Also reloads the op table of torchax's default environment (if it already exists) and of each
    environment in `envs`, so the lowerings take effect there too.
    """
    import torchax
    from torchax.ops import ops_registry

    with _register_lock:
        for op, lowering in LOWERINGS.items():
            overload = torch_overload(op)
            entry = ops_registry.all_aten_ops.get(overload)
            if entry is not None and entry.func is lowering:
                continue  # registering again would only log torchax's duplicate warning
            # is_jax_function: torchax unwraps tensors to jax arrays before the call and wraps
            # the returned array back into a torchax tensor.
            ops_registry.register_torch_dispatch_op(overload, lowering, is_jax_function=True)
        for env in (_existing_default_env(torchax), *envs):
            if env is not None:
                env.load_ops()


def _existing_default_env(torchax_module: Any) -> Any:
    """torchax's default environment if it was already created, else None (creating it here
    would start jax early). torchax 0.0.13 from PyPI keeps it in `_env`, older builds in `env`;
    if neither exists, create it, so the lowerings are never silently missing from it."""
    for name in ("_env", "env"):
        if hasattr(torchax_module, name):
            return getattr(torchax_module, name)
    return torchax_module.default_env()
