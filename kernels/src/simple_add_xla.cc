// XLA bindings of simple_add: typed FFI (CUDA), legacy custom call (CUDA), typed FFI (Host).
// The CUDA variants call the launcher in simple_add_launch.cu; the host variant runs
// xgo::host::SimpleAdd. All of them validate shapes and dtypes before touching any data.
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

// Config of a call from its buffers; InvalidArgument naming the argument if they disagree.
ffi::Error SimpleAddConfigFromBuffers(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                      const ffi::AnyBuffer& out, XgoSimpleAddConfig* config) {
  const int32_t dtype = xgo::ToXgoDtype(a.element_type());
  if (dtype < 0) {
    return ffi::Error::InvalidArgument("simple_add: a: dtype must be float32, float16 or bfloat16");
  }
  if (b.element_type() != a.element_type()) {
    return ffi::Error::InvalidArgument("simple_add: b: dtype differs from a's");
  }
  if (out.element_type() != a.element_type()) {
    return ffi::Error::InvalidArgument("simple_add: out: dtype differs from a's");
  }
  const auto a_dims = a.dimensions();
  if (!std::equal(a_dims.begin(), a_dims.end(), b.dimensions().begin(), b.dimensions().end())) {
    return ffi::Error::InvalidArgument("simple_add: b: shape " + xgo::ShapeString(b.dimensions()) +
                                       " differs from a's " + xgo::ShapeString(a_dims));
  }
  if (!std::equal(a_dims.begin(), a_dims.end(), out.dimensions().begin(),
                  out.dimensions().end())) {
    return ffi::Error::InvalidArgument("simple_add: out: shape " +
                                       xgo::ShapeString(out.dimensions()) + " differs from a's " +
                                       xgo::ShapeString(a_dims));
  }
  *config = XgoSimpleAddConfig{XGO_SIMPLE_ADD_MAGIC, xgo::kConfigVersion, dtype, 0,
                               static_cast<int64_t>(a.element_count())};
  return ffi::Error::Success();
}

ffi::Error SimpleAddCudaImpl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b,
                             ffi::Result<ffi::AnyBuffer> out) {
  XgoSimpleAddConfig config;
  if (ffi::Error error = SimpleAddConfigFromBuffers(a, b, *out, &config); error.failure()) {
    return error;
  }
  if (XgoStatus status = xgo::CheckSimpleAddConfig(config); status != XGO_OK) {
    return xgo::ToFfiError(status);
  }
  return xgo::ToFfiError(xla_gpu_simple_add_launch(&config, a.untyped_data(), b.untyped_data(),
                                                   out->untyped_data(), stream));
}

ffi::Error SimpleAddHostImpl(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> out) {
  XgoSimpleAddConfig config;
  if (ffi::Error error = SimpleAddConfigFromBuffers(a, b, *out, &config); error.failure()) {
    return error;
  }
  if (XgoStatus status = xgo::CheckSimpleAddConfig(config); status != XGO_OK) {
    return xgo::ToFfiError(status);
  }
  return xgo::ToFfiError(
      xgo::host::SimpleAdd(config, a.untyped_data(), b.untyped_data(), out->untyped_data()));
}

}  // namespace

// Default visibility for the handler symbols (the build hides everything else).
extern "C" {
XGO_EXPORT XLA_FFI_Error* xla_gpu_simple_add_cuda_ffi(XLA_FFI_CallFrame* call_frame);
XGO_EXPORT XLA_FFI_Error* xla_gpu_simple_add_host_ffi(XLA_FFI_CallFrame* call_frame);
XGO_EXPORT void xla_gpu_simple_add_cuda_legacy(cudaStream_t stream, void** buffers,
                                               const char* opaque, size_t opaque_len,
                                               XlaCustomCallStatus* status);
}

// Command-buffer compatible: the launcher only enqueues a kernel on `stream`.
XLA_FFI_DEFINE_HANDLER_SYMBOL(xla_gpu_simple_add_cuda_ffi, SimpleAddCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's stream
                                  .Arg<ffi::AnyBuffer>()                     // a
                                  .Arg<ffi::AnyBuffer>()                     // b
                                  .Ret<ffi::AnyBuffer>(),                    // out = a + b
                              {ffi::Traits::kCmdBufferCompatible});

// Legacy custom call (api_version 2): buffers = {a, b, out}; opaque = XgoSimpleAddConfig bytes.
extern "C" void xla_gpu_simple_add_cuda_legacy(cudaStream_t stream, void** buffers,
                                               const char* opaque, size_t opaque_len,
                                               XlaCustomCallStatus* status) {
  XgoSimpleAddConfig config;
  if (opaque == nullptr || opaque_len != sizeof(config)) {
    xgo::SetLastError("simple_add: opaque: expected %zu bytes (XgoSimpleAddConfig), got %zu",
                      sizeof(config), opaque_len);
    xgo::SetLegacyFailure(status, xla_gpu_ops_last_error());
    return;
  }
  std::memcpy(&config, opaque, sizeof(config));  // the opaque carries no alignment guarantee
  if (xgo::CheckSimpleAddConfig(config) != XGO_OK ||
      xla_gpu_simple_add_launch(&config, buffers[0], buffers[1], buffers[2], stream) != XGO_OK) {
    xgo::SetLegacyFailure(status, xla_gpu_ops_last_error());
  }
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(xla_gpu_simple_add_host_ffi, SimpleAddHostImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()   // a
                                  .Arg<ffi::AnyBuffer>()   // b
                                  .Ret<ffi::AnyBuffer>());  // out = a + b
