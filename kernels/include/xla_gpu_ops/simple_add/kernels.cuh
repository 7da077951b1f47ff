// simple_add: out[i] = a[i] + b[i]. The sum is formed in float and rounded once to the element
// type, as PyTorch does, so results match torch bit for bit.
#ifndef XLA_GPU_OPS_SIMPLE_ADD_KERNELS_CUH_
#define XLA_GPU_OPS_SIMPLE_ADD_KERNELS_CUH_

#include <stdint.h>

#include "xla_gpu_ops/device_utils.cuh"

namespace xgo {

// 16-byte vector of elements; the vector body needs a, b and out 16-byte aligned (checked by the
// launcher, which otherwise runs the scalar kernel).
template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

template <typename T>
__global__ void SimpleAddVectorKernel(const T* __restrict__ a, const T* __restrict__ b,
                                      T* __restrict__ out, int64_t num_elements) {
  using V = Vec16<T>;
  const int64_t num_vectors = num_elements / V::kSize;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < num_vectors; i += stride) {
    const V va = reinterpret_cast<const V*>(a)[i];
    const V vb = reinterpret_cast<const V*>(b)[i];
    V vo;
#pragma unroll
    for (int j = 0; j < V::kSize; ++j) vo.v[j] = FromFloat<T>(ToFloat(va.v[j]) + ToFloat(vb.v[j]));
    reinterpret_cast<V*>(out)[i] = vo;
  }
  // Scalar tail: fewer than kSize elements past the last whole vector.
  for (int64_t i = num_vectors * V::kSize + first; i < num_elements; i += stride) {
    out[i] = FromFloat<T>(ToFloat(a[i]) + ToFloat(b[i]));
  }
}

template <typename T>
__global__ void SimpleAddScalarKernel(const T* __restrict__ a, const T* __restrict__ b,
                                      T* __restrict__ out, int64_t num_elements) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < num_elements;
       i += stride) {
    out[i] = FromFloat<T>(ToFloat(a[i]) + ToFloat(b[i]));
  }
}

}  // namespace xgo

#endif  // XLA_GPU_OPS_SIMPLE_ADD_KERNELS_CUH_
