// Device element types per dtype code (dtypes.h) and dispatch from a runtime code to a
// compile-time type. Kernels choose code paths by type traits (IsFloat32), never by sizeof.
#ifndef XLA_GPU_OPS_DTYPES_CUH_
#define XLA_GPU_OPS_DTYPES_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#include "xla_gpu_ops/dtypes.h"
#include "xla_gpu_ops/status.h"

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

template <typename T>
struct TypeTag {
  using Type = T;
};

// fn(TypeTag<CudaType<code>::Type>{}) for the code in Set; XGO_INVALID_DTYPE otherwise, naming
// `what` ("paged_attention: query") and the accepted types.
template <typename Set, typename Fn>
int32_t DispatchCuda(Set, int32_t code, const char* what, Fn&& fn);

template <int32_t... Codes, typename Fn>
int32_t DispatchCuda(DtypeSet<Codes...>, int32_t code, const char* what, Fn&& fn) {
  int32_t status = XGO_INVALID_DTYPE;
  const bool found = ((code == Codes
                           ? (status = fn(TypeTag<typename CudaType<Codes>::Type>{}), true)
                           : false) ||
                      ...);
  if (!found) {
    return Fail(XGO_INVALID_DTYPE, "%s: dtype %s is not %s", what, DtypeText(code).c_str(),
                DtypeSet<Codes...>::Names().c_str());
  }
  return status;
}

}  // namespace xgo

#endif  // XLA_GPU_OPS_DTYPES_CUH_
