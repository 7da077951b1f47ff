"""torchax helpers shared by the front ends that hand torchax tensors to JAX calls
(xla_gpu_ops.torchax, xla_gpu_ops.sharding). Private; importing it imports torchax."""

from __future__ import annotations

from typing import Any

import torchax.view


def store(target: Any, value: Any) -> None:
    """Writes a jax array into a torchax tensor in place, as torchax's own copy_ does (a view
    writes through to the tensor it views)."""
    if isinstance(target, torchax.view.View):
        target.update(value)
    else:
        target._elem = value
