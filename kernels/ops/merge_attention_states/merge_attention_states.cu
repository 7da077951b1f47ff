// merge_attention_states: two attention results over disjoint key sets (a KV split, a shared
// prefix and its suffix, two context-parallel ranks) merged into the result over all the keys,
// from their log-sum-exps: with m = max(lse_a, lse_b), w = exp(lse - m),
//   out = (w_a out_a + w_b out_b) / (w_a + w_b),   lse = m + log(w_a + w_b),
// in float32, out rounded once to out_a's dtype. vLLM's merge_attn_states semantics, with LSE
// [T, H] (FlashInfer's layout); a +inf LSE counts as -inf (an empty part, as FA2 reports it), and
// a row whose two parts are both empty gets out 0 and lse -inf (vLLM's kernels give NaN there).
// Top to bottom: description and static checks, the CUDA kernel and launch, the host (XLA:CPU)
// implementation, XGO_DEFINE_OP.
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "core/cuda_check.cuh"
#include "core/device_utils.cuh"
#include "core/dtypes.cuh"
#include "core/host_types.h"
#include "core/op.h"
#include "core/op_binding.h"
#include "core/status.h"

namespace xgo {

struct MergeAttentionStates {
  static constexpr const char* kName = "merge_attention_states";
  enum { kOutA, kLseA, kOutB, kLseB };
  static constexpr std::array<const char*, 4> kOperandNames = {"out_a", "lse_a", "out_b", "lse_b"};
  enum { kOut = 4, kLse = 5 };
  static constexpr std::array<const char*, 2> kResultNames = {"out", "lse"};
  struct Attrs {};
  static constexpr std::array<AttrSpec, 0> kAttrs = {};

  struct Config {
    int32_t dtype;
    int64_t rows;  // T * H
    int64_t head_dim;
  };

  static int32_t Describe(const OpCall<MergeAttentionStates>& call, Config* config,
                          XgoResults* results);
  static int32_t Launch(const Config& config, void* const* buffers, cudaStream_t stream);
  static int32_t RunHost(const Config& config, void* const* buffers);
  static int32_t CheckHostValues(const Config&, const void* const*) { return XGO_OK; }
};

// ------------------------------------------------------------------ static checks
int32_t MergeAttentionStates::Describe(const OpCall<MergeAttentionStates>& call, Config* config,
                                       XgoResults* results) {
  const Shape& out_a = call.operands[kOutA];
  const Shape& lse_a = call.operands[kLseA];
  const Shape& out_b = call.operands[kOutB];
  const Shape& lse_b = call.operands[kLseB];
  XGO_RETURN_IF_FAILED(CheckRank(kName, "out_a", out_a, 3));
  XGO_RETURN_IF_FAILED(CheckDtype(kName, "out_a", out_a, ComputeDtypes{}));
  XGO_RETURN_IF_FAILED(CheckRank(kName, "out_b", out_b, 3));
  XGO_RETURN_IF_FAILED(CheckSameDtype(kName, "out_b", out_b, "out_a", out_a));
  XGO_RETURN_IF_FAILED(CheckSameDims(kName, "out_b", out_b, "out_a", out_a));
  for (const auto& [name, lse] :
       {std::make_pair("lse_a", &lse_a), std::make_pair("lse_b", &lse_b)}) {
    XGO_RETURN_IF_FAILED(CheckDtype(kName, name, *lse, DtypeSet<XGO_F32>{}));
    XGO_RETURN_IF_FAILED(CheckRank(kName, name, *lse, 2));
    if (lse->dims[0] != out_a.dims[0] || lse->dims[1] != out_a.dims[1]) {
      return Fail(XGO_INVALID_ARGUMENT,
                  "merge_attention_states: %s: shape %s is not out_a's "
                  "[T, H] = (%lld, %lld)",
                  name, lse->Text().c_str(), static_cast<long long>(out_a.dims[0]),
                  static_cast<long long>(out_a.dims[1]));
    }
  }
  *config = Config{out_a.dtype, out_a.dims[0] * out_a.dims[1], out_a.dims[2]};
  results->results[0] = ToXgoShape(out_a);
  results->results[1] = ToXgoShape(lse_a);
  return XGO_OK;
}

// The weights of a row's two parts and its merged LSE; both parts empty: weights 0, lse -inf.
struct MergeWeights {
  float a, b, lse;
};

__host__ __device__ inline MergeWeights Weigh(float lse_a, float lse_b) {
  const float inf = std::numeric_limits<float>::infinity();
  if (lse_a == inf) lse_a = -inf;
  if (lse_b == inf) lse_b = -inf;
  const float m = fmaxf(lse_a, lse_b);
  if (m == -inf) return {0.0f, 0.0f, -inf};
  const float wa = expf(lse_a - m), wb = expf(lse_b - m), sum = wa + wb;
  return {wa / sum, wb / sum, m + logf(sum)};
}

// ------------------------------------------------------------------ CUDA
// One warp per (token, head) row; the lanes stride over head_dim (coalesced).
constexpr int kMergeThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kMergeThreads)
    MergeAttentionStatesKernel(const T* __restrict__ out_a, const float* __restrict__ lse_a,
                               const T* __restrict__ out_b, const float* __restrict__ lse_b,
                               T* __restrict__ out, float* __restrict__ lse, int64_t rows,
                               int head_dim) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kMergeThreads / 32);
  for (int64_t row = blockIdx.x * (kMergeThreads / 32) + threadIdx.x / 32; row < rows;
       row += warps) {
    const MergeWeights w = Weigh(lse_a[row], lse_b[row]);
    if (lane == 0) lse[row] = w.lse;
    const int64_t base = row * head_dim;
    for (int d = lane; d < head_dim; d += 32) {
      out[base + d] = FromFloat<T>(w.a * ToFloat(out_a[base + d]) + w.b * ToFloat(out_b[base + d]));
    }
  }
}

int32_t MergeAttentionStates::Launch(const Config& config, void* const* buffers,
                                     cudaStream_t stream) {
  if (config.rows == 0) return XGO_OK;  // nothing to launch
  const int64_t warps_per_block = kMergeThreads / 32;
  const int blocks = static_cast<int>(
      std::min<int64_t>(65536, (config.rows + warps_per_block - 1) / warps_per_block));
  return DispatchCuda(
      ComputeDtypes{}, config.dtype, "merge_attention_states: out_a", [&](auto type) {
        using T = typename decltype(type)::Type;
        MergeAttentionStatesKernel<T><<<blocks, kMergeThreads, 0, stream>>>(
            static_cast<const T*>(buffers[kOutA]), static_cast<const float*>(buffers[kLseA]),
            static_cast<const T*>(buffers[kOutB]), static_cast<const float*>(buffers[kLseB]),
            static_cast<T*>(buffers[kOut]), static_cast<float*>(buffers[kLse]), config.rows,
            static_cast<int>(config.head_dim));
        XGO_CUDA_CHECK(cudaGetLastError());
        return int32_t{XGO_OK};
      });
}

// ------------------------------------------------------------------ host (XLA:CPU)
int32_t MergeAttentionStates::RunHost(const Config& config, void* const* buffers) {
  return host::DispatchHost(
      ComputeDtypes{}, config.dtype, "merge_attention_states: out_a", [&](auto type) {
        using T = typename decltype(type)::Type;
        using S = typename T::Storage;
        const S* out_a = static_cast<const S*>(buffers[kOutA]);
        const S* out_b = static_cast<const S*>(buffers[kOutB]);
        const float* lse_a = static_cast<const float*>(buffers[kLseA]);
        const float* lse_b = static_cast<const float*>(buffers[kLseB]);
        S* out = static_cast<S*>(buffers[kOut]);
        float* lse = static_cast<float*>(buffers[kLse]);
        for (int64_t row = 0; row < config.rows; ++row) {
          const MergeWeights w = Weigh(lse_a[row], lse_b[row]);
          lse[row] = w.lse;
          for (int64_t d = row * config.head_dim; d < (row + 1) * config.head_dim; ++d) {
            out[d] = T::Store(w.a * T::Load(out_a[d]) + w.b * T::Load(out_b[d]));
          }
        }
        return int32_t{XGO_OK};
      });
}

}  // namespace xgo

using xgo::MergeAttentionStates;
XGO_DEFINE_OP(MergeAttentionStates);
