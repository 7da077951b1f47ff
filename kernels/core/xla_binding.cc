// What the XLA bindings of every op share (op_binding.h): status -> FFI error, and failure
// reporting for legacy (api_version 2) custom calls.
#include <dlfcn.h>

#include <cstring>
#include <optional>
#include <string>

#include "core/op_binding.h"
#include "core/status.h"

namespace xgo {

xla::ffi::Error ToFfiError(int32_t status) {
  if (status == XGO_OK) return xla::ffi::Error::Success();
  std::string message = xla_gpu_ops_last_error();
  if (status == XGO_INVALID_ARGUMENT || status == XGO_INVALID_DTYPE) {
    return xla::ffi::Error::InvalidArgument(std::move(message));
  }
  return xla::ffi::Error::Internal(std::move(message));
}

// Legacy failure reporting.
//
// XLA defines XlaCustomCallStatusSetFailure in xla/service/custom_call_status.cc and compiles
// it into the framework binary (the jax CUDA PJRT plugin, torch_xla's _XLAC), which exports no
// such symbol (checked with `nm -D` on jax_cuda12_plugin 0.7.1: only the PJRT entry points). A
// direct call would therefore be an undefined symbol, which -Wl,--no-undefined rejects and
// which would fail at dlopen even without it. So:
//   1. ask the dynamic linker at run time (dlsym(RTLD_DEFAULT)): a process that does export
//      the function (an XLA linked into the executable or loaded RTLD_GLOBAL) gets its own
//      implementation, which is always right;
//   2. otherwise write the struct XLA defines in custom_call_status_internal.h,
//      `struct XlaCustomCallStatus_ { std::optional<std::string> message; }` (unchanged since
//      2021; a present message means failure), exactly as its SetFailure does. XLA creates the
//      status itself (disengaged) before calling us and reads it afterwards. This needs the same
//      C++ standard library ABI as XLA: jaxlib, its CUDA plugins and torch_xla are built
//      against libstdc++ with the C++11 string ABI and link libstdc++.so.6 dynamically (so
//      operator new/delete are shared); the static_assert below pins this build to the same.
#if !defined(__GLIBCXX__) || !_GLIBCXX_USE_CXX11_ABI
#error "legacy status fallback assumes libstdc++ with the C++11 std::string ABI (as XLA uses)"
#endif
static_assert(sizeof(std::optional<std::string>) == 40, "unexpected std::optional<std::string>");

namespace {

using SetFailureFn = void (*)(XlaCustomCallStatus*, const char*, size_t);

SetFailureFn ResolveSetFailure() {
  static const SetFailureFn resolved =
      reinterpret_cast<SetFailureFn>(dlsym(RTLD_DEFAULT, "XlaCustomCallStatusSetFailure"));
  return resolved;
}

}  // namespace

void SetLegacyFailure(XlaCustomCallStatus* status, const char* message) {
  if (status == nullptr) return;
  const size_t length = std::strlen(message);
  if (SetFailureFn set_failure = ResolveSetFailure()) {
    set_failure(status, message, length);
    return;
  }
  try {
    reinterpret_cast<std::optional<std::string>*>(status)->emplace(message, length);
  } catch (...) {
    // Out of memory while reporting an error: nothing more can be done without aborting.
  }
}

}  // namespace xgo
