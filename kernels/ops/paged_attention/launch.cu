// paged_attention: PagedAttention::Launch (paged_attention.h). The plan (paged_attention/plan.h)
// says which kernel path runs; this file enqueues it on the caller's stream: prep -> attention ->
// (merge), the decode, 64-row and f32 kernels itself, the prefill kernels through
// prefill_mma.cu / prefill_sm90.cu (both below it, as grid.cu is below all three); and the
// decode launchers' split choice. No sync, no
// allocation, metadata never read on the host. The plan's workspace comes from static shapes
// only, so its size is known when a graph is traced.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>

#include "core/cuda_check.cuh"
#include "core/dtypes.cuh"
#include "core/status.h"
#include "ops/paged_attention/decode.cuh"
#include "ops/paged_attention/f32.cuh"
#include "ops/paged_attention/launch.h"
#include "ops/paged_attention/merge.cuh"
#include "ops/paged_attention/paged_attention.h"
#include "ops/paged_attention/params.cuh"
#include "ops/paged_attention/plan.h"
#include "ops/paged_attention/prep.cuh"
#include "xla_gpu_ops/c_api.h"

namespace xgo {

namespace {

constexpr int64_t kMaxPrepBlocks = 1024;
constexpr int64_t kMaxGridY = 65535;

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// Blocks of one KV split that can own rows: real q tiles are at most min(num_q_tiles, T), since
// each holds at least one token.
int64_t BlocksPerSplit(const PagedAttentionPlan& plan, const PagedAttentionParams& params) {
  return std::min<int64_t>(plan.num_q_tiles, params.num_tokens) * plan.num_head_blocks;
}

// KV splits actually used, <= the planned (workspace-sized) count. 16-row decode tiles: the count
// with the least modelled time, waves x (key tiles per split + kSplitOverheadTiles), fewest
// splits on ties (blocks of one split are ~equal in decode, so a partial last wave idles SMs, and
// one wave just under the slot count beats a second wave of a few blocks; key tiles from the
// static capacity pages_per_seq x page_size). Otherwise: the fewest splits whose blocks fill the
// resident slots (SMs x blocks per SM) within kSplitFillTolerance of the best fill. Both
// constants: paged_attention/tuning.h.
int ChooseSplits(const PagedAttentionPlan& plan, const PagedAttentionParams& params,
                 int64_t slots) {
  if (plan.num_splits <= 1 || slots <= 0) return plan.num_splits;
  const int64_t per_split = BlocksPerSplit(plan, params);
  if (plan.path == AttentionPath::kDecodeMma) {
    const int64_t capacity = static_cast<int64_t>(params.pages_per_seq) * params.page_size;
    const int64_t key_tiles = std::max<int64_t>(1, (capacity + kMmaTileKeys - 1) / kMmaTileKeys);
    int best = 1;
    int64_t best_cost = -1;
    for (int splits = 1; splits <= plan.num_splits; ++splits) {
      const int64_t waves = (per_split * splits + slots - 1) / slots;
      const int64_t tiles = (key_tiles + splits - 1) / splits;
      const int64_t cost = waves * (tiles + kSplitOverheadTiles);
      if (best_cost < 0 || cost < best_cost) {
        best_cost = cost;
        best = splits;
      }
    }
    return best;
  }
  auto fill = [&](int splits) {
    const int64_t blocks = per_split * splits;
    const int64_t waves = (blocks + slots - 1) / slots;
    return static_cast<double>(blocks) / static_cast<double>(waves * slots);
  };
  double best_fill = 0.0;
  for (int splits = 1; splits <= plan.num_splits; ++splits)
    best_fill = std::max(best_fill, fill(splits));
  for (int splits = 1; splits <= plan.num_splits; ++splits) {
    if (fill(splits) >= best_fill - kSplitFillTolerance) return splits;
  }
  return plan.num_splits;
}

// Launches kernel<<<grid, kThreads, smem_bytes, stream>>>(params), with programmatic dependent
// launch when asked for and the device supports it (the kernel must then call
// WaitForPreviousKernel before reading anything; it works under stream capture too).
int32_t LaunchKernel(void (*kernel)(PagedAttentionParams), dim3 grid, size_t smem_bytes,
                     bool programmatic, const PagedAttentionParams& params, cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = programmatic ? 1 : 0;
  XGO_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, params));
  return XGO_OK;
}

// programmatic: the kernel checks its own metadata (no prep kernel ran) and may overlap the
// previous kernel's tail (it waits for it before reading anything).
template <typename Kernel>
int32_t LaunchAttention(Kernel kernel, size_t smem_bytes, const PagedAttentionPlan& plan,
                        PagedAttentionParams& params, cudaStream_t stream,
                        bool programmatic = false) {
  KernelLaunchInfo info{};
  if (const int32_t status =
          GetKernelLaunchInfo(reinterpret_cast<const void*>(kernel), smem_bytes, &info);
      status != XGO_OK) {
    return status;
  }
  params.num_splits = ChooseSplits(plan, params, info.slots);
  // The decode kernel (the programmatic launch) numbers head blocks fastest when its blocks take
  // more than one wave: the blocks resident at once then read all kv heads of fewer sequences
  // (-1 to -1.6 %). In one wave every block is resident anyway (the anchor ran
  // 0.3 % slower that way). grid.y holds 65535 q tiles.
  const int64_t q_tiles = plan.num_q_tiles, head_blocks = plan.num_head_blocks;
  const int64_t blocks = BlocksPerSplit(plan, params) * params.num_splits;
  params.head_blocks_fastest = programmatic && blocks > info.slots && q_tiles <= kMaxGridY;
  const dim3 grid(static_cast<unsigned>(params.head_blocks_fastest ? head_blocks : q_tiles),
                  static_cast<unsigned>(params.head_blocks_fastest ? q_tiles : head_blocks),
                  static_cast<unsigned>(params.num_splits));
  if (programmatic) {
    return LaunchKernel(kernel, grid, smem_bytes, info.programmatic_launch, params, stream);
  }
  kernel<<<grid, kThreads, smem_bytes, stream>>>(params);
  XGO_CUDA_CHECK(cudaGetLastError());
  return XGO_OK;
}

// Runtime head_dim -> compile-time kernel, for the path the plan chose. KV: the cache's element
// type (T, or fp8: decode tiles, 64-row tiles and the sm_90a kernel at every head_dim).
template <typename T, typename KV>
int32_t LaunchMma(const PagedAttentionPlan& plan, PagedAttentionParams& params,
                  cudaStream_t stream) {
  const bool decode = plan.path == AttentionPath::kDecodeMma;
#define XGO_LAUNCH_MMA(D, RW)                                                          \
  return LaunchAttention(PagedAttentionMmaKernel<T, KV, D, RW>,                        \
                         MmaKernelConfig<KV, D, RW>::kSmemBytes, plan, params, stream, \
                         /*programmatic=*/RW == 1)
  if (plan.path == AttentionPath::kPrefillSm90) {
    return LaunchPrefillSm90<T, KV>(plan, params, stream);
  }
  if constexpr (IsFp8<KV>) {
    switch (KernelHeadDim(params.head_dim)) {
      case 64:
        if (!decode) XGO_LAUNCH_MMA(64, 4);
        XGO_LAUNCH_MMA(64, 1);
      case 128:
        if (!decode) XGO_LAUNCH_MMA(128, 4);
        XGO_LAUNCH_MMA(128, 1);
      case 256:
        if (!decode) XGO_LAUNCH_MMA(256, 4);
        XGO_LAUNCH_MMA(256, 1);
    }
  } else {
    if (plan.path == AttentionPath::kPrefillMma) return LaunchPrefillMma<T>(plan, params, stream);
    switch (KernelHeadDim(params.head_dim)) {
      case 64:
        XGO_LAUNCH_MMA(64, 1);
      case 128:
        XGO_LAUNCH_MMA(128, 1);
      case 256:
        if (!decode) XGO_LAUNCH_MMA(256, 4);
        XGO_LAUNCH_MMA(256, 1);
    }
  }
#undef XGO_LAUNCH_MMA
  return Fail(XGO_INVALID_ARGUMENT, "paged_attention: query: no kernel for head_dim %d",
              params.head_dim);
}

int32_t LaunchFma(const PagedAttentionPlan& plan, PagedAttentionParams& params,
                  cudaStream_t stream) {
  switch (KernelHeadDim(params.head_dim)) {
    case 64:
      return LaunchAttention(PagedAttentionFmaKernel<64>, FmaConfig<64>::kSmemBytes, plan, params,
                             stream);
    case 128:
      return LaunchAttention(PagedAttentionFmaKernel<128>, FmaConfig<128>::kSmemBytes, plan, params,
                             stream);
    case 256:
      return LaunchAttention(PagedAttentionFmaKernel<256>, FmaConfig<256>::kSmemBytes, plan, params,
                             stream);
  }
  return Fail(XGO_INVALID_ARGUMENT, "paged_attention: query: no kernel for head_dim %d",
              params.head_dim);
}

// Prep -> attention -> (merge), except on the decode path: there the attention kernel checks its
// own metadata (no prep launch on the critical path), then one fill-or-merge kernel writes
// padding / NaN rows; both overlap their predecessor's tail through programmatic dependent
// launch on sm_90+. KV: the cache's element type (T, or fp8 with a 16-bit T).
template <typename T, typename KV>
int32_t LaunchAll(const PagedAttentionPlan& plan, PagedAttentionParams params,
                  cudaStream_t stream) {
  const bool self_checked = plan.path == AttentionPath::kDecodeMma;
  if (!self_checked) {
    const int64_t prep_blocks =
        std::min<int64_t>(kMaxPrepBlocks, std::max(params.max_num_seqs, params.num_tokens));
    const dim3 prep_grid(static_cast<unsigned>(prep_blocks),
                         static_cast<unsigned>(params.page_check_chunks));
    PagedAttentionPrepKernel<T><<<prep_grid, kThreads, 0, stream>>>(params);
    XGO_CUDA_CHECK(cudaGetLastError());
  }
  int32_t status;
  if constexpr (IsFloat32<T>) {
    status = LaunchFma(plan, params, stream);
  } else {
    status = LaunchMma<T, KV>(plan, params, stream);
  }
  if (status != XGO_OK) return status;
  const int64_t rows = static_cast<int64_t>(params.num_tokens) * params.num_q_heads;
  if (self_checked) {
    KernelLaunchInfo info{};
    // Any kernel of this file tells whether the device takes programmatic launches.
    status =
        GetKernelLaunchInfo(reinterpret_cast<const void*>(PagedAttentionFillKernel<T>), 0, &info);
    if (status != XGO_OK) return status;
    if (params.num_splits > 1) {
      return LaunchKernel(PagedAttentionMergeKernel<T, MergeRows::kTokensAndFill>,
                          dim3(static_cast<unsigned>(rows)), 0, info.programmatic_launch, params,
                          stream);
    }
    const int64_t fill_blocks = std::min<int64_t>(kMaxPrepBlocks, params.num_tokens);
    return LaunchKernel(PagedAttentionFillKernel<T>, dim3(static_cast<unsigned>(fill_blocks)), 0,
                        info.programmatic_launch, params, stream);
  }
  if (params.num_splits > 1) {
    PagedAttentionMergeKernel<T, MergeRows::kTokens>
        <<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(params);
    XGO_CUDA_CHECK(cudaGetLastError());
  }
  if (params.short_splits > 1) {
    const int64_t short_rows =
        static_cast<int64_t>(params.max_num_seqs) * params.short_tokens * params.num_q_heads;
    PagedAttentionMergeKernel<T, MergeRows::kShortSequences>
        <<<static_cast<unsigned>(short_rows), kThreads, 0, stream>>>(params);
    XGO_CUDA_CHECK(cudaGetLastError());
  }
  return XGO_OK;
}

// out *= v_scale (the value dequantisation scale) times v_scales' entry for the row's KV head
// (v_scales null: none; stride 0: one entry), rounded once more to the output dtype.
template <typename T>
__global__ void __launch_bounds__(256)
    ScaleRowsKernel(T* out, int64_t n, float v_scale, const float* v_scales, int stride,
                    int head_dim, int num_q_heads, int group_size) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float scale = v_scale;
    if (v_scales != nullptr) {
      const int head = static_cast<int>((i / head_dim) % num_q_heads);
      scale *= v_scales[(head / group_size) * stride];
    }
    out[i] = static_cast<T>(static_cast<float>(out[i]) * scale);
  }
}

template <typename T>
int32_t ScaleRows(const PagedAttentionParams& p, float v_scale, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(p.num_tokens) * p.num_q_heads * p.head_dim;
  const int blocks = static_cast<int>(std::min<int64_t>(4096, (n + 255) / 256));
  ScaleRowsKernel<T><<<blocks, 256, 0, stream>>>(static_cast<T*>(p.out), n, v_scale, p.v_scales,
                                                 p.v_scale_stride, p.head_dim, p.num_q_heads,
                                                 p.group_size);
  XGO_CUDA_CHECK(cudaGetLastError());
  return XGO_OK;
}

}  // namespace

int32_t PagedAttention::Launch(const Config& c, void* const* buffers, cudaStream_t stream) {
  // Describe admits kv_cache in query's dtype or fp8; the CUDA kernels read fp8 with 16-bit
  // queries (the tensor-core kernels), the f32 kernel only an f32 cache.
  if (c.kv_dtype != c.dtype && c.dtype == XGO_F32) {
    return Fail(XGO_INVALID_DTYPE,
                "paged_attention: kv_cache: %s with a float32 query runs on the host (XLA:CPU) "
                "handler and the CPU reference; the CUDA kernels take an fp8 cache with float16 or "
                "bfloat16 queries",
                DtypeText(c.kv_dtype).c_str());
  }
  PlanDevice device;
  XGO_RETURN_IF_FAILED(QueryPlanDevice(&device));
  const PagedAttentionPlan plan = PlaceOnDevice(c, c.plan, device);
  if (c.num_tokens == 0) return XGO_OK;  // empty batch: no rows to write
  for (int i = 0; i <= kWorkspace; ++i) {
    const char* name = i < kOut ? kOperandNames[i] : kResultNames[i - kOut];
    // an optional operand left out is [0]: any pointer
    const bool absent = (i == kSinks && !c.has_sinks) || (i == kKScales && c.k_scales_len == 0) ||
                        (i == kVScales && c.v_scales_len == 0) ||
                        (i == kValueCache && !c.kv.separate());
    if (buffers[i] == nullptr && !absent) {
      return Fail(XGO_INVALID_ARGUMENT, "paged_attention: %s: pointer is NULL", name);
    }
  }
  // 16-byte cp.async and vector stores need aligned rows (every row is a multiple of 16 bytes).
  for (const int i : {int{kQuery}, int{kKvCache}, int{kOut}, int{kWorkspace}, int{kValueCache}}) {
    if (i == kValueCache && !c.kv.separate()) continue;
    if (!Aligned16(buffers[i])) {
      const char* name = i < kOut ? kOperandNames[i] : kResultNames[i - kOut];
      return Fail(XGO_INVALID_ARGUMENT, "paged_attention: %s: must be 16-byte aligned", name);
    }
  }
  float* workspace = static_cast<float*>(buffers[kWorkspace]);
  PagedAttentionParams params{};
  params.query = buffers[kQuery];
  params.kv_cache = buffers[kKvCache];
  // Both caches are 16-byte aligned (checked above), so the difference is whole elements.
  params.v_offset = c.kv.separate() ? (reinterpret_cast<intptr_t>(buffers[kValueCache]) -
                                       reinterpret_cast<intptr_t>(buffers[kKvCache])) /
                                          DtypeSize(c.kv_dtype)
                                    : c.kv.v_offset;
  params.kv_page_stride = c.kv.page_stride;
  params.kv_row_stride = static_cast<int>(c.kv.row_stride);
  params.kv_head_stride = static_cast<int>(c.kv.head_stride);
  params.context_lens = static_cast<const int32_t*>(buffers[kContextLens]);
  params.block_tables = static_cast<const int32_t*>(buffers[kBlockTables]);
  params.query_start_loc = static_cast<const int32_t*>(buffers[kQueryStartLoc]);
  params.num_seqs = static_cast<const int32_t*>(buffers[kNumSeqs]);
  params.out = buffers[kOut];
  params.lse = static_cast<float*>(buffers[kLse]);
  params.sinks = c.has_sinks ? static_cast<const float*>(buffers[kSinks]) : nullptr;
  params.k_scales = c.k_scales_len > 0 ? static_cast<const float*>(buffers[kKScales]) : nullptr;
  params.k_scale_stride = c.k_scales_len > 1 ? 1 : 0;
  params.v_scales = c.v_scales_len > 0 ? static_cast<const float*>(buffers[kVScales]) : nullptr;
  params.v_scale_stride = c.v_scales_len > 1 ? 1 : 0;
  params.flags = reinterpret_cast<int32_t*>(workspace);
  params.partial_state = reinterpret_cast<PartState*>(workspace + plan.state_offset);
  params.partial_out = workspace + plan.out_offset;
  params.short_state = reinterpret_cast<PartState*>(workspace + plan.short_state_offset);
  params.short_out = workspace + plan.short_out_offset;
  params.short_order = reinterpret_cast<int32_t*>(workspace + plan.short_order_offset);
  params.short_tokens = plan.short_tokens;
  params.short_splits = plan.short_splits;
  params.num_tokens = static_cast<int>(c.num_tokens);
  params.num_q_heads = static_cast<int>(c.num_q_heads);
  params.num_kv_heads = static_cast<int>(c.kv.num_kv_heads);
  params.head_dim = static_cast<int>(c.head_dim);
  params.part_dim = KernelHeadDim(c.head_dim);
  // block_tables are int32, so no page past INT32_MAX can be named anyway.
  params.num_pages = static_cast<int>(std::min<int64_t>(c.kv.num_pages, INT32_MAX));
  params.page_size = static_cast<int>(c.kv.page_size);
  params.page_size_div = MakeFastDivisor(params.page_size);
  params.max_num_seqs = static_cast<int>(c.max_num_seqs);
  params.pages_per_seq = static_cast<int>(c.pages_per_seq);
  params.group_size = static_cast<int>(c.num_q_heads / c.kv.num_kv_heads);
  params.heads_per_block = plan.heads_per_block;
  params.tokens_per_tile = plan.tokens_per_tile;
  params.num_splits = plan.num_splits;
  params.page_check_chunks = static_cast<int>(plan.page_check_chunks);
  // A window longer than any context (int32) masks nothing, same as no window.
  params.sliding_window = static_cast<int>(std::min<int64_t>(c.sliding_window, INT32_MAX));
  params.scale = c.scale * c.k_scale;  // logits = q.k * scale * k_scale
  params.soft_cap = c.soft_cap;
  return DispatchCuda(ComputeDtypes{}, c.dtype, "paged_attention: query", [&](auto type) {
    using T = typename decltype(type)::Type;
    if constexpr (IsTensorCoreType<T>) {
      if (plan.fp8_kv) {
        XGO_RETURN_IF_FAILED((LaunchAll<T, __nv_fp8_e4m3>(plan, params, stream)));
      } else {
        XGO_RETURN_IF_FAILED((LaunchAll<T, T>(plan, params, stream)));
      }
    } else {
      XGO_RETURN_IF_FAILED((LaunchAll<T, T>(plan, params, stream)));
    }
    if (c.v_scale == 1.0f && params.v_scales == nullptr) return int32_t{XGO_OK};
    return ScaleRows<T>(params, c.v_scale, stream);
  });
}

}  // namespace xgo
