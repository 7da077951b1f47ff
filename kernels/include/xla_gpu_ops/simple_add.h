// simple_add: out = a + b (same shape and dtype; float32, float16 or bfloat16; any size).
// The op struct of op.h; its Launch is in src/simple_add/launch.cu, the rest in
// src/simple_add/op.cc.
#ifndef XLA_GPU_OPS_SIMPLE_ADD_H_
#define XLA_GPU_OPS_SIMPLE_ADD_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

#include <array>

#include "xla_gpu_ops/op.h"

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

}  // namespace xgo

#endif  // XLA_GPU_OPS_SIMPLE_ADD_H_
