// simple_add: out = a + b (same shape and dtype; float32, float16 or bfloat16; any size), the
// sum formed in float and rounded once to the element type, as PyTorch does (results match torch
// bit for bit). The whole op in one file, top to bottom: its description (names, attributes,
// static checks), the CUDA kernels and their launch, the host (XLA:CPU) implementation, and the
// registration that makes every handler of the op table. The template of `nox -s new_op`.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>
#include <array>

#include "core/cuda_check.cuh"
#include "core/device_utils.cuh"
#include "core/dtypes.cuh"
#include "core/host_types.h"
#include "core/op.h"
#include "core/op_binding.h"
#include "core/status.h"

namespace xgo {

struct SimpleAdd {
  static constexpr const char* kName = "simple_add";
  enum { kA, kB };
  static constexpr std::array<const char*, 2> kOperandNames = {"a", "b"};
  enum { kOut = 2 };  // buffer index: results follow the operands
  static constexpr std::array<const char*, 1> kResultNames = {"out"};
  struct Attrs {};
  static constexpr std::array<AttrSpec, 0> kAttrs = {};

  struct Config {
    int32_t dtype;
    int64_t num_elements;
  };

  static int32_t Describe(const OpCall<SimpleAdd>& call, Config* config, XgoResults* results);
  static int32_t Launch(const Config& config, void* const* buffers, cudaStream_t stream);
  static int32_t RunHost(const Config& config, void* const* buffers);
  static int32_t CheckHostValues(const Config&, const void* const*) { return XGO_OK; }
};

// ------------------------------------------------------------------ static checks
int32_t SimpleAdd::Describe(const OpCall<SimpleAdd>& call, Config* config, XgoResults* results) {
  const Shape& a = call.operands[kA];
  const Shape& b = call.operands[kB];
  XGO_RETURN_IF_FAILED(CheckDtype(kName, "a", a, ComputeDtypes{}));
  XGO_RETURN_IF_FAILED(CheckSameDtype(kName, "b", b, "a", a));
  XGO_RETURN_IF_FAILED(CheckSameDims(kName, "b", b, "a", a));
  *config = Config{a.dtype, a.elements()};
  results->results[0] = ToXgoShape(a);
  return XGO_OK;
}

// ------------------------------------------------------------------ CUDA
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
    const int blocks =
        static_cast<int>(std::min(kMaxAddBlocks, (vectors + kAddThreads - 1) / kAddThreads));
    SimpleAddVectorKernel<T><<<blocks, kAddThreads, 0, stream>>>(ta, tb, tout, n);
  } else {
    const int blocks =
        static_cast<int>(std::min(kMaxAddBlocks, (n + kAddThreads - 1) / kAddThreads));
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

// ------------------------------------------------------------------ host (XLA:CPU)
// The sum is formed in f32 and rounded once: for f16/bf16 inputs this equals the correctly
// rounded sum (f32 has more than 2p+2 bits, so the double rounding is innocuous).
int32_t SimpleAdd::RunHost(const Config& config, void* const* buffers) {
  return host::DispatchHost(ComputeDtypes{}, config.dtype, "simple_add: a", [&](auto type) {
    using T = typename decltype(type)::Type;
    using S = typename T::Storage;
    const S* lhs = static_cast<const S*>(buffers[kA]);
    const S* rhs = static_cast<const S*>(buffers[kB]);
    S* sum = static_cast<S*>(buffers[kOut]);
    for (int64_t i = 0; i < config.num_elements; ++i) {
      sum[i] = T::Store(T::Load(lhs[i]) + T::Load(rhs[i]));
    }
    return int32_t{XGO_OK};
  });
}

}  // namespace xgo

using xgo::SimpleAdd;
XGO_DEFINE_OP(SimpleAdd);
