// Dequantisation scales as the kernels and host handlers read them: an attribute (k_scale,
// v_scale) times, where the caller gave a tensor, its entry for the KV head (k_scales, v_scales:
// one entry for every head, stride 0, or one per head, stride 1). Plain data, so a launch passes
// it to a kernel by value; the tensors stay on the device and are read at run time.
#ifndef XLA_GPU_OPS_CORE_SCALES_H_
#define XLA_GPU_OPS_CORE_SCALES_H_

#include <stdint.h>

#ifdef __CUDACC__
#define XGO_HOST_DEVICE __host__ __device__
#else
#define XGO_HOST_DEVICE
#endif

namespace xgo {

struct KvScales {
  float k_scale, v_scale;
  const float* k_scales;  // nullptr: none
  const float* v_scales;
  int k_stride, v_stride;

  XGO_HOST_DEVICE float K(int64_t kv_head) const {
    return k_scales == nullptr ? k_scale : k_scale * k_scales[kv_head * k_stride];
  }
  XGO_HOST_DEVICE float V(int64_t kv_head) const {
    return v_scales == nullptr ? v_scale : v_scale * v_scales[kv_head * v_stride];
  }
  // Combined head h of an interleaved cache row: K of KV head h / 2 when even, V when odd.
  XGO_HOST_DEVICE float OfCombinedHead(int64_t h) const { return h % 2 == 0 ? K(h / 2) : V(h / 2); }
};

// The scales of a call: the attributes, and the tensors (their entry counts from Describe: 0 for
// none) at the buffers the call got.
inline KvScales MakeKvScales(float k_scale, float v_scale, int64_t k_len, int64_t v_len,
                             const void* k_scales, const void* v_scales) {
  return {k_scale,
          v_scale,
          k_len > 0 ? static_cast<const float*>(k_scales) : nullptr,
          v_len > 0 ? static_cast<const float*>(v_scales) : nullptr,
          k_len > 1 ? 1 : 0,
          v_len > 1 ? 1 : 0};
}

}  // namespace xgo

#endif  // XLA_GPU_OPS_CORE_SCALES_H_
