// simple_add: the static checks of a call, the host (XLA:CPU) implementation and the op's entry
// in the op table.
#include "xla_gpu_ops/simple_add.h"

#include "xla_gpu_ops/host_types.h"
#include "xla_gpu_ops/op_binding.h"

namespace xgo {

int32_t SimpleAdd::Describe(const OpCall<SimpleAdd>& call, Config* config, XgoResults* results) {
  const Shape& a = call.operands[kA];
  const Shape& b = call.operands[kB];
  XGO_RETURN_IF_FAILED(CheckDtype(kName, "a", a, ComputeDtypes{}));
  XGO_RETURN_IF_FAILED(CheckSameDtype(kName, "b", b, "a", a));
  if (!b.SameDims(a)) {
    return Fail(XGO_INVALID_ARGUMENT, "simple_add: b: shape %s differs from a's %s",
                b.Text().c_str(), a.Text().c_str());
  }
  *config = Config{a.dtype, a.elements()};
  results->results[0] = ToXgoShape(a);
  return XGO_OK;
}

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
XGO_DEFINE_OP(SimpleAdd, kSimpleAddInfo);
