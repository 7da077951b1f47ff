// Small device helpers shared by the kernels: 16-byte cp.async, ldmatrix, the m16n8k16 tensor-core
// MMA (inline PTX, sm_80+), and float <-> element conversions. Nothing here is sm_90a-only, so the
// same code serves every arch of the default build (80;86;89;90a).
#ifndef XLA_GPU_OPS_DEVICE_UTILS_CUH_
#define XLA_GPU_OPS_DEVICE_UTILS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

namespace xgo {

template <typename T>
__device__ __forceinline__ float ToFloat(T x);
template <>
__device__ __forceinline__ float ToFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float ToFloat<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __nv_fp8_e4m3 FromFloat<__nv_fp8_e4m3>(float x) {
  return __nv_fp8_e4m3(x);  // round to nearest even, saturating to +-448 (__NV_SATFINITE)
}

__device__ __forceinline__ uint32_t SharedAddress(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// 16-byte global -> shared copy that bypasses L1; src_bytes == 0 fills the 16 bytes with zeros
// (used for keys past the sequence end, so masked V rows are finite zeros, never stale data).
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(smem)),
               "l"(gmem), "r"(src_bytes));
}
// The same with an L2 cache policy (createpolicy), e.g. EvictFirstPolicy().
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, int src_bytes,
                                          uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(
                   SharedAddress(smem)),
               "l"(gmem), "r"(src_bytes), "l"(policy));
}
// L2 policy for data read exactly once (decode K/V): evicted first, so the stream does not push
// out what is read again soon (block tables, the split parts the merge kernel reads).
__device__ __forceinline__ uint64_t EvictFirstPolicy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(smem)));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(smem)));
}

// d += a * b for one m16n8k16 tile, f32 accumulators; T is __half or __nv_bfloat16.
template <typename T>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1);
template <>
__device__ __forceinline__ void Mma16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                 uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void Mma16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                        uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a * b for one m16n8k8 tile (8 keys of P V where a warp owns only 8 keys of a tile).
template <typename T>
__device__ __forceinline__ void Mma1688(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b);
template <>
__device__ __forceinline__ void Mma1688<__half>(float (&d)[4], uint32_t a0, uint32_t a1,
                                                uint32_t b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b));
}
template <>
__device__ __forceinline__ void Mma1688<__nv_bfloat16>(float (&d)[4], uint32_t a0, uint32_t a1,
                                                       uint32_t b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b));
}

// Two floats -> one 32-bit register of two 16-bit elements (lo in the low half), for MMA A
// operands.
template <typename T>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t PackPair<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t PackPair<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// 16 float8_e4m3fn values (one 16-byte chunk) -> 16 values of T (two 16-byte chunks: lo holds
// elements 0-7, hi 8-15). Exact: every e4m3 value is a float16 and a bfloat16 value; NaN stays
// NaN. One cvt per pair to float16 (native on sm_89+), and for bfloat16 two more steps via f32.
template <typename T>
__device__ __forceinline__ uint32_t Fp8PairTo(uint32_t pair);
template <>
__device__ __forceinline__ uint32_t Fp8PairTo<__half>(uint32_t pair) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}
template <>
__device__ __forceinline__ uint32_t Fp8PairTo<__nv_bfloat16>(uint32_t pair) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
  const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(__half2(h)));
  return *reinterpret_cast<const uint32_t*>(&b);
}
template <typename T>
__device__ __forceinline__ void Fp8x16To(const uint4& in, uint4& lo, uint4& hi) {
  lo = make_uint4(Fp8PairTo<T>(in.x & 0xffffu), Fp8PairTo<T>(in.x >> 16),
                  Fp8PairTo<T>(in.y & 0xffffu), Fp8PairTo<T>(in.y >> 16));
  hi = make_uint4(Fp8PairTo<T>(in.z & 0xffffu), Fp8PairTo<T>(in.z >> 16),
                  Fp8PairTo<T>(in.w & 0xffffu), Fp8PairTo<T>(in.w >> 16));
}

}  // namespace xgo

#endif  // XLA_GPU_OPS_DEVICE_UTILS_CUH_
