// Element types on the C++ side, derived from the one list in c_api.h (XGO_DTYPE_LIST): names
// and sizes for messages and checks, and dtype sets that an operand accepts. Device and host
// element types for dispatch live next to their code (dtypes.cuh, host_types.h) and key on the
// same codes, so adding a dtype starts from the list.
#ifndef XLA_GPU_OPS_DTYPES_H_
#define XLA_GPU_OPS_DTYPES_H_

#include <stdint.h>

#include <string>

#include "core/status.h"
#include "xla_gpu_ops/c_api.h"

namespace xgo {

// "bfloat16"; nullptr for a code outside the list.
constexpr const char* DtypeName(int32_t code) {
  switch (code) {
#define XGO_DTYPE_NAME_CASE(name, value, text, size) \
  case value:                                        \
    return text;
    XGO_DTYPE_LIST(XGO_DTYPE_NAME_CASE)
#undef XGO_DTYPE_NAME_CASE
  }
  return nullptr;
}

// Bytes per element; 0 for a code outside the list.
constexpr int DtypeSize(int32_t code) {
  switch (code) {
#define XGO_DTYPE_SIZE_CASE(name, value, text, size) \
  case value:                                        \
    return size;
    XGO_DTYPE_LIST(XGO_DTYPE_SIZE_CASE)
#undef XGO_DTYPE_SIZE_CASE
  }
  return 0;
}

// A set of dtype codes an operand accepts, e.g. DtypeSet<XGO_F32, XGO_F16, XGO_BF16>.
template <int32_t... Codes>
struct DtypeSet {
  static constexpr bool Contains(int32_t code) { return ((code == Codes) || ...); }
  // "float32, float16 or bfloat16", for error messages.
  static std::string Names() {
    const char* names[] = {DtypeName(Codes)...};
    std::string text;
    constexpr size_t n = sizeof...(Codes);
    for (size_t i = 0; i < n; ++i) {
      if (i > 0) text += i + 1 == n ? " or " : ", ";
      text += names[i];
    }
    return text;
  }
};

// The floating-point types the attention and add kernels compute in.
using ComputeDtypes = DtypeSet<XGO_F32, XGO_F16, XGO_BF16>;

// A name for any code, for messages ("dtype code 9" when outside the list).
inline std::string DtypeText(int32_t code) {
  const char* name = DtypeName(code);
  return name != nullptr ? std::string(name) : "dtype code " + std::to_string(code);
}

template <typename T>
struct TypeTag {
  using Type = T;
};

// fn(TypeTag<TypeOf<code>::Type>{}) for the code in the set (TypeOf: CudaType in device code,
// HostType in the host handlers); XGO_INVALID_DTYPE otherwise, naming `what`
// ("paged_attention: query") and the accepted types.
template <template <int32_t> class TypeOf, int32_t... Codes, typename Fn>
int32_t DispatchDtype(DtypeSet<Codes...>, int32_t code, const char* what, Fn&& fn) {
  int32_t status = XGO_INVALID_DTYPE;
  const bool found =
      ((code == Codes ? (status = fn(TypeTag<typename TypeOf<Codes>::Type>{}), true) : false) ||
       ...);
  if (!found) {
    return Fail(XGO_INVALID_DTYPE, "%s: dtype %s is not %s", what, DtypeText(code).c_str(),
                DtypeSet<Codes...>::Names().c_str());
  }
  return status;
}

}  // namespace xgo

#endif  // XLA_GPU_OPS_DTYPES_H_
