// From an op struct (op.h) to its entry in the library's op table (c_api.h): the static checks
// from an XgoCall, the eager launch, the host value checks, the typed XLA FFI handlers (CUDA and
// Host) and the legacy custom call. Every entry point decodes its inputs into the same OpCall and
// runs the op's one Describe, so all of them accept and reject exactly the same calls.
//
// Each op's source ends with XGO_DEFINE_OP(Op). Only that file includes this header (it pulls in
// the XLA FFI headers).
#ifndef XLA_GPU_OPS_OP_BINDING_H_
#define XLA_GPU_OPS_OP_BINDING_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

#include <cstring>
#include <string>

#include "core/op.h"
#include "core/status.h"
#include "xla/ffi/api/ffi.h"
#include "xla_gpu_ops/c_api.h"

// XLA's opaque status handle of legacy custom calls (xla/service/custom_call_status.h).
typedef struct XlaCustomCallStatus_ XlaCustomCallStatus;

namespace xgo {

// Marks a legacy custom call as failed with `message`; never throws, never aborts.
void SetLegacyFailure(XlaCustomCallStatus* status, const char* message);
// A status (with this thread's last error) as an FFI error.
xla::ffi::Error ToFfiError(int32_t status);

// The XgoDtype of an FFI element type, or -1 outside the list (same names on both sides).
inline int32_t FromFfiDtype(xla::ffi::DataType dtype) {
  switch (dtype) {
#define XGO_FFI_DTYPE_CASE(name, code, text, size) \
  case xla::ffi::DataType::name:                   \
    return code;
    XGO_DTYPE_LIST(XGO_FFI_DTYPE_CASE)
#undef XGO_FFI_DTYPE_CASE
    default:
      return -1;
  }
}

template <typename Op>
int32_t DecodeCall(const XgoCall* call, OpCall<Op>* decoded) {
  if (call == nullptr) return Fail(XGO_INVALID_ARGUMENT, "%s: call: is NULL", Op::kName);
  if (call->magic != XGO_CALL_MAGIC || call->abi_version != XGO_ABI_VERSION) {
    return Fail(XGO_INVALID_ARGUMENT,
                "%s: call: not an XgoCall of ABI version %d (magic 0x%08x, version %u)", Op::kName,
                XGO_ABI_VERSION, call->magic, call->abi_version);
  }
  if (std::strncmp(call->op, Op::kName, XGO_MAX_OP_NAME) != 0) {
    return Fail(XGO_INVALID_ARGUMENT, "%s: call: describes op '%.*s'", Op::kName, XGO_MAX_OP_NAME,
                call->op);
  }
  if (call->num_operands != NumOperands<Op>() || call->num_attrs != NumAttrs<Op>()) {
    return Fail(XGO_INVALID_ARGUMENT, "%s: call: %d operands and %d attributes, expected %d and %d",
                Op::kName, call->num_operands, call->num_attrs, NumOperands<Op>(), NumAttrs<Op>());
  }
  for (int i = 0; i < NumOperands<Op>(); ++i) {
    const XgoShape& given = call->operands[i];
    if (given.rank < 0 || given.rank > XGO_MAX_RANK) {
      return Fail(XGO_INVALID_ARGUMENT, "%s: %s: rank %d is outside [0, %d]", Op::kName,
                  Op::kOperandNames[i], given.rank, XGO_MAX_RANK);
    }
    Shape& shape = decoded->operands[i];
    shape.dtype = given.dtype;
    shape.rank = given.rank;
    for (int d = 0; d < given.rank; ++d) shape.dims[d] = given.dims[d];
  }
  for (int a = 0; a < NumAttrs<Op>(); ++a) {
    const AttrSpec& spec = Op::kAttrs[a];
    char* member = reinterpret_cast<char*>(&decoded->attrs) + spec.offset;
    if (spec.type == XGO_ATTR_F32) {
      const float value = static_cast<float>(call->attrs[a].f64);
      std::memcpy(member, &value, sizeof(value));
    } else {
      std::memcpy(member, &call->attrs[a].i64, sizeof(int64_t));
    }
  }
  return XGO_OK;
}

template <typename Op>
int32_t DescribeCall(const OpCall<Op>& call, typename Op::Config* config, XgoResults* results) {
  *results = XgoResults{};
  results->num_results = NumResults<Op>();
  return Op::Describe(call, config, results);
}

// ------------------------------------------------------------------ C entry points
template <typename Op>
int32_t DescribeEntry(const XgoCall* call, XgoResults* results) {
  if (results == nullptr) return Fail(XGO_INVALID_ARGUMENT, "%s: results: is NULL", Op::kName);
  OpCall<Op> decoded;
  XGO_RETURN_IF_FAILED(DecodeCall(call, &decoded));
  typename Op::Config config;
  return DescribeCall(decoded, &config, results);
}

template <typename Op>
int32_t LaunchEntry(const XgoCall* call, void* const* buffers, void* cuda_stream) {
  OpCall<Op> decoded;
  XGO_RETURN_IF_FAILED(DecodeCall(call, &decoded));
  typename Op::Config config;
  XgoResults results;
  XGO_RETURN_IF_FAILED(DescribeCall(decoded, &config, &results));
  if (buffers == nullptr) return Fail(XGO_INVALID_ARGUMENT, "%s: buffers: is NULL", Op::kName);
  return Op::Launch(config, buffers, static_cast<cudaStream_t>(cuda_stream));
}

template <typename Op>
int32_t CheckHostValuesEntry(const XgoCall* call, const void* const* operands) {
  OpCall<Op> decoded;
  XGO_RETURN_IF_FAILED(DecodeCall(call, &decoded));
  typename Op::Config config;
  XgoResults results;
  XGO_RETURN_IF_FAILED(DescribeCall(decoded, &config, &results));
  if (operands == nullptr) return Fail(XGO_INVALID_ARGUMENT, "%s: operands: is NULL", Op::kName);
  return Op::CheckHostValues(config, operands);
}

// Legacy custom call (api_version 2): buffers = operands then results; opaque = XgoCall bytes.
template <typename Op>
void LegacyEntry(cudaStream_t stream, void** buffers, const char* opaque, size_t opaque_len,
                 XlaCustomCallStatus* status) {
  XgoCall call;
  if (opaque == nullptr || opaque_len != sizeof(call)) {
    SetLastError("%s: opaque: expected %zu bytes (an XgoCall), got %zu", Op::kName, sizeof(call),
                 opaque_len);
    SetLegacyFailure(status, xla_gpu_ops_last_error());
    return;
  }
  std::memcpy(&call, opaque, sizeof(call));  // the opaque carries no alignment guarantee
  if (LaunchEntry<Op>(&call, buffers, stream) != XGO_OK) {
    SetLegacyFailure(status, xla_gpu_ops_last_error());
  }
}

// ------------------------------------------------------------------ typed FFI
// One signature for every op and both platforms: operands and results as buffers in the op's
// order (checked against its names), attributes as a dictionary decoded through Op::kAttrs.
template <typename Op>
xla::ffi::Error DecodeFfiCall(const xla::ffi::RemainingArgs& args,
                              const xla::ffi::RemainingRets& rets,
                              const xla::ffi::Dictionary& attrs, typename Op::Config* config,
                              void** buffers) {
  namespace ffi = xla::ffi;
  auto invalid = [](const std::string& message) {
    return ffi::Error::InvalidArgument(std::string(Op::kName) + ": " + message);
  };
  if (static_cast<int>(args.size()) != NumOperands<Op>()) {
    return invalid("expected " + std::to_string(NumOperands<Op>()) + " operands, got " +
                   std::to_string(args.size()));
  }
  OpCall<Op> call;
  for (int i = 0; i < NumOperands<Op>(); ++i) {
    ffi::ErrorOr<ffi::AnyBuffer> buffer = args.get<ffi::AnyBuffer>(i);
    if (!buffer.has_value()) return invalid(std::string(Op::kOperandNames[i]) + ": not a buffer");
    const auto dims = buffer->dimensions();
    if (dims.size() > XGO_MAX_RANK) {
      return invalid(std::string(Op::kOperandNames[i]) + ": rank " + std::to_string(dims.size()) +
                     " is too large");
    }
    Shape& shape = call.operands[i];
    shape.dtype = FromFfiDtype(buffer->element_type());
    shape.rank = static_cast<int>(dims.size());
    for (size_t d = 0; d < dims.size(); ++d) shape.dims[d] = dims[d];
    buffers[i] = buffer->untyped_data();
  }
  for (int a = 0; a < NumAttrs<Op>(); ++a) {
    const AttrSpec& spec = Op::kAttrs[a];
    char* member = reinterpret_cast<char*>(&call.attrs) + spec.offset;
    if (spec.type == XGO_ATTR_F32) {
      ffi::ErrorOr<float> value = attrs.get<float>(spec.name);
      if (!value.has_value()) return invalid(std::string(spec.name) + ": missing, or not an f32");
      std::memcpy(member, &*value, sizeof(float));
    } else {
      ffi::ErrorOr<int64_t> value = attrs.get<int64_t>(spec.name);
      if (!value.has_value()) return invalid(std::string(spec.name) + ": missing, or not an i64");
      std::memcpy(member, &*value, sizeof(int64_t));
    }
  }
  XgoResults results;
  if (const int32_t status = DescribeCall(call, config, &results); status != XGO_OK) {
    return ToFfiError(status);
  }
  if (static_cast<int>(rets.size()) != NumResults<Op>()) {
    return invalid("expected " + std::to_string(NumResults<Op>()) + " results, got " +
                   std::to_string(rets.size()));
  }
  for (int j = 0; j < NumResults<Op>(); ++j) {
    ffi::ErrorOr<ffi::Result<ffi::AnyBuffer>> result = rets.get<ffi::AnyBuffer>(j);
    if (!result.has_value()) return invalid(std::string(Op::kResultNames[j]) + ": not a buffer");
    const XgoShape& expected = results.results[j];
    const auto dims = (*result)->dimensions();
    bool same = FromFfiDtype((*result)->element_type()) == expected.dtype &&
                static_cast<int>(dims.size()) == expected.rank;
    for (int d = 0; same && d < expected.rank; ++d) same = dims[d] == expected.dims[d];
    if (!same) {
      Shape want;
      want.dtype = expected.dtype;
      want.rank = expected.rank;
      for (int d = 0; d < expected.rank; ++d) want.dims[d] = expected.dims[d];
      return invalid(std::string(Op::kResultNames[j]) + ": expected " + DtypeText(expected.dtype) +
                     want.Text());
    }
    buffers[NumOperands<Op>() + j] = (*result)->untyped_data();
  }
  return ffi::Error::Success();
}

template <typename Op>
xla::ffi::Error CudaFfiImpl(cudaStream_t stream, xla::ffi::RemainingArgs args,
                            xla::ffi::RemainingRets rets, xla::ffi::Dictionary attrs) {
  typename Op::Config config;
  void* buffers[NumOperands<Op>() + NumResults<Op>()];
  if (xla::ffi::Error error = DecodeFfiCall<Op>(args, rets, attrs, &config, buffers);
      error.failure()) {
    return error;
  }
  return ToFfiError(Op::Launch(config, buffers, stream));
}

template <typename Op>
xla::ffi::Error HostFfiImpl(xla::ffi::RemainingArgs args, xla::ffi::RemainingRets rets,
                            xla::ffi::Dictionary attrs) {
  typename Op::Config config;
  void* buffers[NumOperands<Op>() + NumResults<Op>()];
  if (xla::ffi::Error error = DecodeFfiCall<Op>(args, rets, attrs, &config, buffers);
      error.failure()) {
    return error;
  }
  return ToFfiError(Op::RunHost(config, buffers));
}

// The attribute types in the order of Op::kAttrs, for the table.
template <typename Op>
struct AttrTypes {
  static constexpr auto Make() {
    std::array<int32_t, NumAttrs<Op>()> types{};
    for (int a = 0; a < NumAttrs<Op>(); ++a) types[a] = Op::kAttrs[a].type;
    return types;
  }
  static constexpr std::array<int32_t, NumAttrs<Op>()> kTypes = Make();
};

template <typename Op>
struct AttrNames {
  static constexpr auto Make() {
    std::array<const char*, NumAttrs<Op>()> names{};
    for (int a = 0; a < NumAttrs<Op>(); ++a) names[a] = Op::kAttrs[a].name;
    return names;
  }
  static constexpr std::array<const char*, NumAttrs<Op>()> kNames = Make();
};

}  // namespace xgo

// Defines the op's XLA handlers and its entry in the library's op table, registered when the
// library loads: an op is in the table by being compiled into it (kernels/CMakeLists.txt takes
// every source under kernels/ops/). The CUDA handler is command-buffer compatible: Op::Launch
// only enqueues work on XLA's stream (scratch space is a result), so XLA may capture it into a
// CUDA graph.
#define XGO_DEFINE_OP(Op)                                                                         \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(Op##_cuda_ffi, ::xgo::CudaFfiImpl<Op>,                            \
                                ::xla::ffi::Ffi::Bind()                                           \
                                    .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()              \
                                    .RemainingArgs()                                              \
                                    .RemainingRets()                                              \
                                    .Attrs(),                                                     \
                                {::xla::ffi::Traits::kCmdBufferCompatible});                      \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(Op##_host_ffi, ::xgo::HostFfiImpl<Op>,                            \
                                ::xla::ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs()); \
  extern "C" void Op##_cuda_legacy(cudaStream_t stream, void** buffers, const char* opaque,       \
                                   size_t opaque_len, XlaCustomCallStatus* status) {              \
    ::xgo::LegacyEntry<Op>(stream, buffers, opaque, opaque_len, status);                          \
  }                                                                                               \
  namespace {                                                                                     \
  const XgoOpInfo Op##_info = {                                                                   \
      Op::kName,                                                                                  \
      ::xgo::NumOperands<Op>(),                                                                   \
      ::xgo::NumResults<Op>(),                                                                    \
      ::xgo::NumAttrs<Op>(),                                                                      \
      0,                                                                                          \
      Op::kOperandNames.data(),                                                                   \
      Op::kResultNames.data(),                                                                    \
      ::xgo::AttrNames<Op>::kNames.data(),                                                        \
      ::xgo::AttrTypes<Op>::kTypes.data(),                                                        \
      &::xgo::DescribeEntry<Op>,                                                                  \
      &::xgo::LaunchEntry<Op>,                                                                    \
      &::xgo::CheckHostValuesEntry<Op>,                                                           \
      reinterpret_cast<void*>(&Op##_cuda_ffi),                                                    \
      reinterpret_cast<void*>(&Op##_host_ffi),                                                    \
      reinterpret_cast<void*>(&Op##_cuda_legacy),                                                 \
  };                                                                                              \
  [[maybe_unused]] const bool Op##_registered = ::xgo::RegisterOp(&Op##_info);                    \
  }  // namespace

#endif  // XLA_GPU_OPS_OP_BINDING_H_
