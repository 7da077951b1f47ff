// One way to turn a CUDA error into a launcher status: XGO_CUDA_CHECK(expr) returns
// XGO_CUDA_ERROR from the enclosing function (with the last error naming the call and the CUDA
// message) when expr is not cudaSuccess. Launchers call it after every CUDA call and launch.
#ifndef XLA_GPU_OPS_CUDA_CHECK_CUH_
#define XLA_GPU_OPS_CUDA_CHECK_CUH_

#include <cuda_runtime.h>

#include "core/status.h"

#define XGO_CUDA_CHECK(expr)                                                                      \
  do {                                                                                            \
    cudaError_t xgo_cuda_error_ = (expr);                                                         \
    if (xgo_cuda_error_ != cudaSuccess) {                                                         \
      return ::xgo::Fail(XGO_CUDA_ERROR, "%s:%d: %s failed: %s (%s)", __FILE__, __LINE__, #expr,  \
                         cudaGetErrorString(xgo_cuda_error_), cudaGetErrorName(xgo_cuda_error_)); \
    }                                                                                             \
  } while (0)

// After a <<<...>>> launch: launch-configuration errors surface only through the last error.
#define XGO_CUDA_CHECK_LAUNCH(what) XGO_CUDA_CHECK((what, cudaGetLastError()))

#endif  // XLA_GPU_OPS_CUDA_CHECK_CUH_
