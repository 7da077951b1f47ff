// rms_norm: out = x / sqrt(mean(x^2 over the last dim) + eps) * weight, computed in float32 and
// rounded once to x's dtype (x [..., H] float32, float16 or bfloat16; weight [H] of x's dtype).
// Top to bottom: description and static checks, the CUDA kernel and its launch, the host
// (XLA:CPU) implementation, XGO_DEFINE_OP.
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "core/cuda_check.cuh"
#include "core/device_utils.cuh"
#include "core/dtypes.cuh"
#include "core/host_types.h"
#include "core/op.h"
#include "core/op_binding.h"
#include "core/status.h"

namespace xgo {

struct RmsNorm {
  static constexpr const char* kName = "rms_norm";
  enum { kX, kWeight };
  static constexpr std::array<const char*, 2> kOperandNames = {"x", "weight"};
  enum { kOut = 2 };
  static constexpr std::array<const char*, 1> kResultNames = {"out"};
  struct Attrs {
    float eps;
  };
  static constexpr std::array<AttrSpec, 1> kAttrs = {{{"eps", XGO_ATTR_F32, offsetof(Attrs, eps)}}};

  struct Config {
    int32_t dtype;
    int64_t rows;
    int64_t hidden;
    float eps;
  };

  static int32_t Describe(const OpCall<RmsNorm>& call, Config* config, XgoResults* results);
  static int32_t Launch(const Config& config, void* const* buffers, cudaStream_t stream);
  static int32_t RunHost(const Config& config, void* const* buffers);
  static int32_t CheckHostValues(const Config&, const void* const*) { return XGO_OK; }
};

// ------------------------------------------------------------------ static checks
int32_t RmsNorm::Describe(const OpCall<RmsNorm>& call, Config* config, XgoResults* results) {
  const Shape& x = call.operands[kX];
  const Shape& weight = call.operands[kWeight];
  XGO_RETURN_IF_FAILED(CheckDtype(kName, "x", x, ComputeDtypes{}));
  XGO_RETURN_IF_FAILED(CheckSameDtype(kName, "weight", weight, "x", x));
  XGO_RETURN_IF_FAILED(CheckRank(kName, "weight", weight, 1));
  if (x.rank < 1 || x.dims[x.rank - 1] != weight.dims[0]) {
    return Fail(XGO_INVALID_ARGUMENT, "rms_norm: weight: shape %s does not match x's last dim, %s",
                weight.Text().c_str(), x.Text().c_str());
  }
  if (!(call.attrs.eps >= 0.0f) || !std::isfinite(call.attrs.eps)) {
    return Fail(XGO_INVALID_ARGUMENT, "rms_norm: eps: must be finite and >= 0, got %g",
                static_cast<double>(call.attrs.eps));
  }
  const int64_t hidden = weight.dims[0];
  if (hidden > (int64_t{1} << 30)) {
    return Fail(XGO_INVALID_ARGUMENT, "rms_norm: weight: H = %lld is larger than 2^30",
                static_cast<long long>(hidden));
  }
  *config = Config{x.dtype, hidden == 0 ? 0 : x.elements() / hidden, hidden, call.attrs.eps};
  results->results[0] = ToXgoShape(x);
  return XGO_OK;
}

// ------------------------------------------------------------------ CUDA
// One block per row (grid-stride over rows). Pass 1 sums the squares with 16-byte loads where the
// row allows them; pass 2 reads the row again (from L1/L2: a 4k bf16 row is 8 KB) and writes it.
constexpr int kRmsThreads = 256;

template <typename T>
struct alignas(16) RmsVec {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

__device__ __forceinline__ float BlockSum(float value, float* shared) {
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < kRmsThreads / 32 ? shared[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  __syncthreads();  // shared is reused by the next row
  return value;
}

template <typename T, bool kVector>
__global__ void __launch_bounds__(kRmsThreads)
    RmsNormKernel(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ out,
                  int64_t rows, int64_t hidden, float eps) {
  __shared__ float partial[kRmsThreads / 32];
  using V = RmsVec<T>;
  // 32-bit indices within a row (Describe bounds H): 64-bit ones spilled in the f32 kernel.
  const int chunks = static_cast<int>(hidden / (kVector ? V::kSize : 1));
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* in = x + row * hidden;
    T* dst = out + row * hidden;
    float squares = 0.0f;
    for (int c = threadIdx.x; c < chunks; c += kRmsThreads) {
      if constexpr (kVector) {
        const V v = reinterpret_cast<const V*>(in)[c];
#pragma unroll
        for (int j = 0; j < V::kSize; ++j) squares += ToFloat(v.v[j]) * ToFloat(v.v[j]);
      } else {
        const float v = ToFloat(in[c]);
        squares += v * v;
      }
    }
    const float inv_rms = rsqrtf(BlockSum(squares, partial) / static_cast<float>(hidden) + eps);
    for (int c = threadIdx.x; c < chunks; c += kRmsThreads) {
      if constexpr (kVector) {
        const V v = reinterpret_cast<const V*>(in)[c];
        const V w = reinterpret_cast<const V*>(weight)[c];
        V o;
#pragma unroll
        for (int j = 0; j < V::kSize; ++j) {
          o.v[j] = FromFloat<T>(ToFloat(v.v[j]) * inv_rms * ToFloat(w.v[j]));
        }
        reinterpret_cast<V*>(dst)[c] = o;
      } else {
        dst[c] = FromFloat<T>(ToFloat(in[c]) * inv_rms * ToFloat(weight[c]));
      }
    }
  }
}

int32_t RmsNorm::Launch(const Config& config, void* const* buffers, cudaStream_t stream) {
  if (config.rows == 0 || config.hidden == 0) return XGO_OK;  // nothing to launch
  const int blocks = static_cast<int>(std::min<int64_t>(config.rows, 1 << 16));
  return DispatchCuda(ComputeDtypes{}, config.dtype, "rms_norm: x", [&](auto type) {
    using T = typename decltype(type)::Type;
    const T* x = static_cast<const T*>(buffers[kX]);
    const T* weight = static_cast<const T*>(buffers[kWeight]);
    T* out = static_cast<T*>(buffers[kOut]);
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (config.hidden % RmsVec<T>::kSize == 0 && aligned(x) && aligned(weight) && aligned(out)) {
      RmsNormKernel<T, true><<<blocks, kRmsThreads, 0, stream>>>(x, weight, out, config.rows,
                                                                 config.hidden, config.eps);
    } else {
      RmsNormKernel<T, false><<<blocks, kRmsThreads, 0, stream>>>(x, weight, out, config.rows,
                                                                  config.hidden, config.eps);
    }
    XGO_CUDA_CHECK(cudaGetLastError());
    return int32_t{XGO_OK};
  });
}

// ------------------------------------------------------------------ host (XLA:CPU)
int32_t RmsNorm::RunHost(const Config& config, void* const* buffers) {
  return host::DispatchHost(ComputeDtypes{}, config.dtype, "rms_norm: x", [&](auto type) {
    using T = typename decltype(type)::Type;
    using S = typename T::Storage;
    const S* weight = static_cast<const S*>(buffers[kWeight]);
    for (int64_t row = 0; row < config.rows; ++row) {
      const S* in = static_cast<const S*>(buffers[kX]) + row * config.hidden;
      S* dst = static_cast<S*>(buffers[kOut]) + row * config.hidden;
      float squares = 0.0f;
      for (int64_t i = 0; i < config.hidden; ++i) squares += T::Load(in[i]) * T::Load(in[i]);
      const float inv_rms =
          1.0f / std::sqrt(squares / static_cast<float>(config.hidden) + config.eps);
      for (int64_t i = 0; i < config.hidden; ++i) {
        dst[i] = T::Store(T::Load(in[i]) * inv_rms * T::Load(weight[i]));
      }
    }
    return int32_t{XGO_OK};
  });
}

}  // namespace xgo

using xgo::RmsNorm;
XGO_DEFINE_OP(RmsNorm);
