"""The op table: each op is named once here; every C symbol, XLA target and torch name derives from it."""

from __future__ import annotations

from dataclasses import dataclass

NAMESPACE = "xla_gpu"


@dataclass(frozen=True)
class OpSpec:
    name: str  # e.g. "paged_attention"

    # C symbols in libxla_gpu_ops.so (see kernels/include/xla_gpu_ops/c_api.h)
    @property
    def launch_symbol(self) -> str:
        return f"{NAMESPACE}_{self.name}_launch"

    @property
    def cuda_ffi_symbol(self) -> str:
        return f"{NAMESPACE}_{self.name}_cuda_ffi"

    @property
    def host_ffi_symbol(self) -> str:
        return f"{NAMESPACE}_{self.name}_host_ffi"

    @property
    def cuda_legacy_symbol(self) -> str:
        return f"{NAMESPACE}_{self.name}_cuda_legacy"

    # XLA custom-call targets
    @property
    def ffi_target(self) -> str:
        """Typed FFI target (api_version 4), registered for platforms CUDA and Host."""
        return f"{NAMESPACE}_{self.name}"

    @property
    def legacy_target(self) -> str:
        """Legacy status-returning target (api_version 2), CUDA only."""
        return f"{NAMESPACE}_{self.name}_legacy"

    # torch.library
    @property
    def torch_qualname(self) -> str:
        return f"{NAMESPACE}::{self.name}"


SIMPLE_ADD = OpSpec("simple_add")
PAGED_ATTENTION = OpSpec("paged_attention")
OPS: tuple[OpSpec, ...] = (SIMPLE_ADD, PAGED_ATTENTION)
