// XLA bindings of paged_attention: typed FFI (CUDA), legacy custom call (CUDA), typed FFI (Host).
// Semantics: docs/DESIGN.md. The CUDA variants validate everything static (ranks, shapes, dtypes,
// attributes, workspace size) and call the launcher in paged_attention_launch.cu; they never
// read the device-resident metadata (that would be a sync). The host variant has the metadata in
// host memory and validates it fully (xgo::host::CheckPagedAttentionMetadata).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "xla/ffi/api/ffi.h"
#include "xla_gpu_ops/c_api.h"
#include "xla_gpu_ops/config_check.h"
#include "xla_gpu_ops/host_kernels.h"
#include "xla_gpu_ops/status.h"
#include "xla_gpu_ops/xla_binding.h"

namespace ffi = xla::ffi;

namespace {

using ffi::AnyBuffer;
using I32Buffer = ffi::Buffer<ffi::S32>;
using F32Buffer = ffi::Buffer<ffi::F32>;

ffi::Error Invalid(const std::string& argument, const std::string& message) {
  return ffi::Error::InvalidArgument("paged_attention: " + argument + ": " + message);
}

template <typename Dims>
ffi::Error CheckRank(const char* argument, const Dims& dims, size_t rank) {
  if (dims.size() == rank) return ffi::Error::Success();
  return Invalid(argument, "expected rank " + std::to_string(rank) + ", got shape " +
                               xgo::ShapeString(dims));
}

#define XGO_RETURN_IF_ERROR(expr)                            \
  do {                                                       \
    if (ffi::Error xgo_error = (expr); xgo_error.failure()) { \
      return xgo_error;                                      \
    }                                                        \
  } while (0)

// The config of a call from its buffers and attributes: every static check of
// xla_gpu_ops._validation.check_paged_attention_static, then CheckPagedAttentionConfig.
ffi::Error PagedAttentionConfigFromBuffers(const AnyBuffer& query, const AnyBuffer& kv_cache,
                                           const I32Buffer& context_lens,
                                           const I32Buffer& block_tables,
                                           const I32Buffer& query_start_loc,
                                           const I32Buffer& num_seqs, const AnyBuffer& out,
                                           float scale, int64_t sliding_window, float soft_cap,
                                           XgoPagedAttentionConfig* config) {
  const auto q_dims = query.dimensions();
  const auto kv_dims = kv_cache.dimensions();
  XGO_RETURN_IF_ERROR(CheckRank("query", q_dims, 3));
  XGO_RETURN_IF_ERROR(CheckRank("kv_cache", kv_dims, 4));
  XGO_RETURN_IF_ERROR(CheckRank("context_lens", context_lens.dimensions(), 1));
  XGO_RETURN_IF_ERROR(CheckRank("block_tables", block_tables.dimensions(), 2));
  XGO_RETURN_IF_ERROR(CheckRank("query_start_loc", query_start_loc.dimensions(), 1));
  XGO_RETURN_IF_ERROR(CheckRank("num_seqs", num_seqs.dimensions(), 1));
  const int32_t dtype = xgo::ToXgoDtype(query.element_type());
  if (dtype < 0) return Invalid("query", "dtype must be float32, float16 or bfloat16");
  if (kv_cache.element_type() != query.element_type()) {
    return Invalid("kv_cache", "dtype differs from query's");
  }
  if (out.element_type() != query.element_type()) {
    return Invalid("out", "dtype differs from query's");
  }
  const auto out_dims = out.dimensions();
  if (!std::equal(q_dims.begin(), q_dims.end(), out_dims.begin(), out_dims.end())) {
    return Invalid("out", "shape " + xgo::ShapeString(out_dims) + " differs from query's " +
                              xgo::ShapeString(q_dims));
  }
  if (kv_dims[3] != q_dims[2]) {
    return Invalid("kv_cache", "head_dim " + std::to_string(kv_dims[3]) +
                                   " differs from query's " + std::to_string(q_dims[2]));
  }
  if (kv_dims[2] <= 0 || kv_dims[2] % 2 != 0) {
    return Invalid("kv_cache", "dim 2 must be 2 * num_kv_heads (K and V interleaved), got " +
                                   std::to_string(kv_dims[2]));
  }
  const int64_t max_num_seqs = context_lens.dimensions()[0];
  if (block_tables.dimensions()[0] != max_num_seqs) {
    return Invalid("block_tables", "dim 0 is " + std::to_string(block_tables.dimensions()[0]) +
                                       ", context_lens has " + std::to_string(max_num_seqs));
  }
  if (query_start_loc.dimensions()[0] != max_num_seqs + 1) {
    return Invalid("query_start_loc", "shape must be (" + std::to_string(max_num_seqs + 1) +
                                          ",), got " +
                                          xgo::ShapeString(query_start_loc.dimensions()));
  }
  if (num_seqs.dimensions()[0] != 1) {
    return Invalid("num_seqs", "shape must be (1,), got " + xgo::ShapeString(num_seqs.dimensions()));
  }
  *config = XgoPagedAttentionConfig{};
  config->magic = XGO_PAGED_ATTENTION_MAGIC;
  config->version = xgo::kConfigVersion;
  config->dtype = dtype;
  config->num_tokens = q_dims[0];
  config->num_q_heads = q_dims[1];
  config->head_dim = q_dims[2];
  config->num_pages = kv_dims[0];
  config->page_size = kv_dims[1];
  config->num_kv_heads = kv_dims[2] / 2;
  config->max_num_seqs = max_num_seqs;
  config->pages_per_seq = block_tables.dimensions()[1];
  config->sliding_window = sliding_window;
  config->scale = scale;
  config->soft_cap = soft_cap;
  return xgo::ToFfiError(xgo::CheckPagedAttentionConfig(*config));
}

ffi::Error PagedAttentionCudaImpl(cudaStream_t stream, AnyBuffer query, AnyBuffer kv_cache,
                                  I32Buffer context_lens, I32Buffer block_tables,
                                  I32Buffer query_start_loc, I32Buffer num_seqs,
                                  ffi::Result<AnyBuffer> out, ffi::Result<F32Buffer> workspace,
                                  float scale, int64_t sliding_window, float soft_cap) {
  XgoPagedAttentionConfig config;
  XGO_RETURN_IF_ERROR(PagedAttentionConfigFromBuffers(query, kv_cache, context_lens,
                                                      block_tables, query_start_loc, num_seqs,
                                                      *out, scale, sliding_window, soft_cap,
                                                      &config));
  XGO_RETURN_IF_ERROR(CheckRank("workspace", workspace->dimensions(), 1));
  const int64_t needed = xla_gpu_paged_attention_workspace_elems(&config);
  if (needed < 0) return xgo::ToFfiError(XGO_INVALID_ARGUMENT);
  const int64_t given = static_cast<int64_t>(workspace->element_count());
  if (given < needed) {
    return Invalid("workspace", "has " + std::to_string(given) + " float32 elements, needs " +
                                    std::to_string(needed));
  }
  return xgo::ToFfiError(xla_gpu_paged_attention_launch(
      &config, query.untyped_data(), kv_cache.untyped_data(), context_lens.typed_data(),
      block_tables.typed_data(), query_start_loc.typed_data(), num_seqs.typed_data(),
      out->untyped_data(), workspace->typed_data(), given, stream));
}

ffi::Error PagedAttentionHostImpl(AnyBuffer query, AnyBuffer kv_cache, I32Buffer context_lens,
                                  I32Buffer block_tables, I32Buffer query_start_loc,
                                  I32Buffer num_seqs, ffi::Result<AnyBuffer> out,
                                  ffi::Result<F32Buffer> /*workspace: unused on the host*/,
                                  float scale, int64_t sliding_window, float soft_cap) {
  XgoPagedAttentionConfig config;
  XGO_RETURN_IF_ERROR(PagedAttentionConfigFromBuffers(query, kv_cache, context_lens,
                                                      block_tables, query_start_loc, num_seqs,
                                                      *out, scale, sliding_window, soft_cap,
                                                      &config));
  return xgo::ToFfiError(xgo::host::PagedAttention(
      config, query.untyped_data(), kv_cache.untyped_data(), context_lens.typed_data(),
      block_tables.typed_data(), query_start_loc.typed_data(), num_seqs.typed_data(),
      out->untyped_data()));
}

}  // namespace

// Default visibility for the handler symbols (the build hides everything else).
extern "C" {
XGO_EXPORT XLA_FFI_Error* xla_gpu_paged_attention_cuda_ffi(XLA_FFI_CallFrame* call_frame);
XGO_EXPORT XLA_FFI_Error* xla_gpu_paged_attention_host_ffi(XLA_FFI_CallFrame* call_frame);
XGO_EXPORT void xla_gpu_paged_attention_cuda_legacy(cudaStream_t stream, void** buffers,
                                                    const char* opaque, size_t opaque_len,
                                                    XlaCustomCallStatus* status);
}

// Command-buffer compatible: the launcher only enqueues kernels on `stream`; its scratch space
// is the `workspace` output, so it never allocates, synchronises or copies to the host.
XLA_FFI_DEFINE_HANDLER_SYMBOL(xla_gpu_paged_attention_cuda_ffi, PagedAttentionCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's stream
                                  .Arg<AnyBuffer>()  // query [T, Hq, D]
                                  .Arg<AnyBuffer>()  // kv_cache [P, page_size, 2*Hkv, D]
                                  .Arg<I32Buffer>()  // context_lens [S]
                                  .Arg<I32Buffer>()  // block_tables [S, pages_per_seq]
                                  .Arg<I32Buffer>()  // query_start_loc [S + 1]
                                  .Arg<I32Buffer>()  // num_seqs [1]
                                  .Ret<AnyBuffer>()  // out [T, Hq, D]
                                  .Ret<F32Buffer>()  // workspace [workspace_elems] scratch
                                  .Attr<float>("scale")              // logits multiplier
                                  .Attr<int64_t>("sliding_window")  // 0: no window
                                  .Attr<float>("soft_cap"),         // 0: no cap
                              {ffi::Traits::kCmdBufferCompatible});

// Legacy custom call (api_version 2): buffers = {query, kv_cache, context_lens, block_tables,
// query_start_loc, num_seqs, out, workspace}; opaque = XgoPagedAttentionConfig bytes. Buffer
// shapes are not visible here, so the opaque's config is trusted after its own checks.
extern "C" void xla_gpu_paged_attention_cuda_legacy(cudaStream_t stream, void** buffers,
                                                    const char* opaque, size_t opaque_len,
                                                    XlaCustomCallStatus* status) {
  XgoPagedAttentionConfig config;
  if (opaque == nullptr || opaque_len != sizeof(config)) {
    xgo::SetLastError(
        "paged_attention: opaque: expected %zu bytes (XgoPagedAttentionConfig), got %zu",
        sizeof(config), opaque_len);
    xgo::SetLegacyFailure(status, xla_gpu_ops_last_error());
    return;
  }
  std::memcpy(&config, opaque, sizeof(config));  // the opaque carries no alignment guarantee
  if (xgo::CheckPagedAttentionConfig(config) != XGO_OK) {
    xgo::SetLegacyFailure(status, xla_gpu_ops_last_error());
    return;
  }
  const int64_t workspace_elems = xla_gpu_paged_attention_workspace_elems(&config);
  if (workspace_elems < 0 ||
      xla_gpu_paged_attention_launch(
          &config, buffers[0], buffers[1], static_cast<const int32_t*>(buffers[2]),
          static_cast<const int32_t*>(buffers[3]), static_cast<const int32_t*>(buffers[4]),
          static_cast<const int32_t*>(buffers[5]), buffers[6], static_cast<float*>(buffers[7]),
          workspace_elems, stream) != XGO_OK) {
    xgo::SetLegacyFailure(status, xla_gpu_ops_last_error());
  }
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(xla_gpu_paged_attention_host_ffi, PagedAttentionHostImpl,
                              ffi::Ffi::Bind()
                                  .Arg<AnyBuffer>()  // query [T, Hq, D]
                                  .Arg<AnyBuffer>()  // kv_cache [P, page_size, 2*Hkv, D]
                                  .Arg<I32Buffer>()  // context_lens [S]
                                  .Arg<I32Buffer>()  // block_tables [S, pages_per_seq]
                                  .Arg<I32Buffer>()  // query_start_loc [S + 1]
                                  .Arg<I32Buffer>()  // num_seqs [1]
                                  .Ret<AnyBuffer>()  // out [T, Hq, D]
                                  .Ret<F32Buffer>()  // workspace: accepted, unused on the host
                                  .Attr<float>("scale")              // logits multiplier
                                  .Attr<int64_t>("sliding_window")  // 0: no window
                                  .Attr<float>("soft_cap"));        // 0: no cap
