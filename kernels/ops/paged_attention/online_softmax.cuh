// paged_attention: the online-softmax step, one for every attention kernel of the library
// (decode and 64-row tiles, the mma.sync and sm_90a prefill kernels, the f32 kernel): per K/V
// tile, fold the tile's row maxima into the running maxima, exponentiate the tile's logits
// against the new maxima and rescale what was summed so far; after the last tile, the row sums
// and their inverses (a KV split part keeps `max` and `sum` as they are: PartState). Log2 domain
// throughout (logits are scaled by log2(e) before they get here, or by the `mult` the sm_90a
// kernel folds into the exponent).
//
// A thread holds kRows rows (two per m16 accumulator tile: elements e of each 4-register group
// belong to row e >> 1); a row's logits are spread over kRowLanes adjacent lanes (lanes l ^ 1,
// l ^ 2, ...): the quad of an MMA accumulator row (4), the 8 lanes of an f32 kernel row.
#ifndef XLA_GPU_OPS_PAGED_ATTENTION_ONLINE_SOFTMAX_CUH_
#define XLA_GPU_OPS_PAGED_ATTENTION_ONLINE_SOFTMAX_CUH_

#include <math.h>

namespace xgo {

__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// kApprox: ex2.approx.ftz (the prefill kernels, where the exponentials are a bound); kFull: exp2f
// (the memory-bound decode tiles and the exact f32 kernel).
enum class Exp2Mode { kApprox, kFull };

template <Exp2Mode kMode>
__device__ __forceinline__ float Exp2(float x) {
  if constexpr (kMode == Exp2Mode::kApprox) {
    return FastExp2(x);
  } else {
    return exp2f(x);
  }
}

template <int kRows, int kRowLanes, Exp2Mode kMode>
struct OnlineSoftmax {
  static_assert(kRowLanes >= 1 && kRowLanes <= 32 && (kRowLanes & (kRowLanes - 1)) == 0,
                "a row's lanes: a power of two within the warp");
  float max[kRows];      // running maximum of the row's logits; -inf until the row sees a key
  float sum[kRows];      // this lane's part of sum(exp2(logit - max)) until SumRows
  float base[kRows];     // this tile's exponent base: the new maximum, 0 while it is -inf
  float rescale[kRows];  // exp2(old maximum - base): the factor for O (sums already scaled)

  __device__ __forceinline__ OnlineSoftmax() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      max[r] = -INFINITY;
      sum[r] = 0.0f;
    }
  }

  // Folds this lane's maxima of the tile's logits into the running maxima (over the row's lanes),
  // sets base and rescale, and rescales the sums. `mult` > 0 multiplies the logits first (the
  // sm_90a kernel keeps raw q.k on unmasked tiles and scales in the exponent; -inf stays -inf).
  // Returns whether some maximum of this lane's rows moved: where none did in a warp, O needs no
  // rescale (rescale is 1 then).
  __device__ __forceinline__ bool Fold(float (&tile_max)[kRows], float mult = 1.0f) {
    bool moved = false;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float m = tile_max[r];
#pragma unroll
      for (int lanes = 1; lanes < kRowLanes; lanes *= 2) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, lanes));
      }
      m *= mult;
      const float new_max = fmaxf(max[r], m);
      base[r] = new_max == -INFINITY ? 0.0f : new_max;  // fully masked so far: no inf - inf
      rescale[r] = Exp2<kMode>(max[r] - base[r]);
      moved |= new_max != max[r];
      max[r] = new_max;
      sum[r] *= rescale[r];
    }
    return moved;
  }

  // The probability of one logit of row r, added to the row's sum; with `mult`, of the logit
  // times mult (as given to Fold: one FFMA per logit).
  __device__ __forceinline__ float Prob(float logit, int r) {
    const float prob = Exp2<kMode>(logit - base[r]);
    sum[r] += prob;
    return prob;
  }
  __device__ __forceinline__ float Prob(float logit, int r, float mult) {
    const float prob = Exp2<kMode>(fmaf(logit, mult, -base[r]));
    sum[r] += prob;
    return prob;
  }

  // O's rows by the last Fold's factors, O in accumulator layout: [tiles][4] (mma.sync) or flat
  // (wgmma: element i in row (i >> 1) & 1). Two rows per thread: one m16 tile.
  template <int kTiles>
  __device__ __forceinline__ void Rescale(float (&o)[kTiles][4], int row0 = 0) const {
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      o[i][0] *= rescale[row0];
      o[i][1] *= rescale[row0];
      o[i][2] *= rescale[row0 + 1];
      o[i][3] *= rescale[row0 + 1];
    }
  }
  template <int kN>
  __device__ __forceinline__ void Rescale(float (&o)[kN]) const {
    static_assert(kRows == 2 && kN % 4 == 0, "one m64 wgmma accumulator: two rows per thread");
#pragma unroll
    for (int i = 0; i < kN; ++i) o[i] *= rescale[(i >> 1) & 1];
  }

  // After the last tile: every lane of a row holds the row's whole sum.
  __device__ __forceinline__ void SumRows() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int lanes = 1; lanes < kRowLanes; lanes *= 2) {
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], lanes);
      }
    }
  }
  // 1 / (sum + extra), 0 for a row that saw no key (its output is 0); `extra` is a finished
  // row's attention sink (SinkTerm), 0 otherwise.
  __device__ __forceinline__ float Inverse(int r, float extra = 0.0f) const {
    const float total = sum[r] + extra;
    return total > 0.0f ? 1.0f / total : 0.0f;
  }
};

}  // namespace xgo

#endif  // XLA_GPU_OPS_PAGED_ATTENTION_ONLINE_SOFTMAX_CUH_
