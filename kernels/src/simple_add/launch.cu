// simple_add: SimpleAdd::Launch (simple_add.h): one grid-stride launch on the caller's stream,
// the 16-byte vector kernel when a, b and out are 16-byte aligned, else the scalar one.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>

#include "xla_gpu_ops/c_api.h"
#include "xla_gpu_ops/cuda_check.cuh"
#include "xla_gpu_ops/dtypes.cuh"
#include "xla_gpu_ops/simple_add.h"
#include "xla_gpu_ops/simple_add/kernels.cuh"
#include "xla_gpu_ops/status.h"

namespace xgo {
namespace {

constexpr int kAddThreads = 256;
// Enough blocks to keep every SM of the largest GPUs busy; the grid-stride loop does the rest.
constexpr int64_t kMaxAddBlocks = 4096;

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

template <typename T>
int32_t LaunchSimpleAdd(const void* a, const void* b, void* out, int64_t n, cudaStream_t stream) {
  const T* ta = static_cast<const T*>(a);
  const T* tb = static_cast<const T*>(b);
  T* tout = static_cast<T*>(out);
  if (Aligned16(a) && Aligned16(b) && Aligned16(out)) {
    const int64_t vectors = std::max<int64_t>(1, n / Vec16<T>::kSize);
    const int blocks = static_cast<int>(std::min(kMaxAddBlocks, (vectors + kAddThreads - 1) / kAddThreads));
    SimpleAddVectorKernel<T><<<blocks, kAddThreads, 0, stream>>>(ta, tb, tout, n);
  } else {
    const int blocks = static_cast<int>(std::min(kMaxAddBlocks, (n + kAddThreads - 1) / kAddThreads));
    SimpleAddScalarKernel<T><<<blocks, kAddThreads, 0, stream>>>(ta, tb, tout, n);
  }
  XGO_CUDA_CHECK(cudaGetLastError());
  return XGO_OK;
}

}  // namespace

int32_t SimpleAdd::Launch(const Config& config, void* const* buffers, cudaStream_t stream) {
  const int64_t n = config.num_elements;
  if (n == 0) return XGO_OK;  // nothing to launch
  for (int i = 0; i <= kOut; ++i) {
    if (buffers[i] == nullptr) {
      return Fail(XGO_INVALID_ARGUMENT, "simple_add: %s: pointer is NULL",
                  i < kOut ? kOperandNames[i] : kResultNames[0]);
    }
  }
  return DispatchCuda(ComputeDtypes{}, config.dtype, "simple_add: a", [&](auto type) {
    return LaunchSimpleAdd<typename decltype(type)::Type>(buffers[kA], buffers[kB], buffers[kOut],
                                                          n, stream);
  });
}

}  // namespace xgo
