// Device element types per dtype code (dtypes.h) and dispatch from a runtime code to a
// compile-time type. Kernels choose code paths by type traits (IsFloat32), never by sizeof.
#ifndef XLA_GPU_OPS_DTYPES_CUH_
#define XLA_GPU_OPS_DTYPES_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include <type_traits>

#include "core/dtypes.h"

namespace xgo {

template <int32_t Code>
struct CudaType;
template <>
struct CudaType<XGO_F32> {
  using Type = float;
};
template <>
struct CudaType<XGO_F16> {
  using Type = __half;
};
template <>
struct CudaType<XGO_BF16> {
  using Type = __nv_bfloat16;
};

template <typename T>
inline constexpr bool IsFloat32 = std::is_same_v<T, float>;
// 16-bit types the tensor-core (mma.sync / wgmma) paths take.
template <typename T>
inline constexpr bool IsTensorCoreType =
    std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

// KV-cache element types read through the dequantisation scales (k_scale, v_scale).
template <typename T>
inline constexpr bool IsFp8 = std::is_same_v<T, __nv_fp8_e4m3>;

template <typename Set, typename Fn>
int32_t DispatchCuda(Set set, int32_t code, const char* what, Fn&& fn) {
  return DispatchDtype<CudaType>(set, code, what, static_cast<Fn&&>(fn));
}

}  // namespace xgo

#endif  // XLA_GPU_OPS_DTYPES_CUH_
