// Mixture of experts on the stream (no host round trip): the routing's row sort (topk) and the expert job that
// groups tokens by expert and runs each expert's projections on the GEMV/GEMM kernels. See native/moe.cc.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels.h"
#include "quant.h"

namespace kiln {

/** One expert projection: y [M, N] = x [M, K] @ W^T (+ bias [N]). */
struct MoeProjection {
  int kind = 0;  // 0: f32 W [N, K]; 1: bf16 W [N, K]; 2: quantized (scheme, quant.h layouts)
  int scheme = 0;
  const void* w = nullptr;
  const void* scales = nullptr;
  const int32_t* rowSums = nullptr;
  const float* bias = nullptr;  // nullptr: none
};

/**
 * out [T, H] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t]); expert e is down(act(gate(x), up(x))) with
 * proj[3e], proj[3e + 1], proj[3e + 2] (gate/up [I, H], down [H, I]). act 0: silu(g) * u; 1: gpt-oss's
 * (clamp(u, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit). Ids outside [0, E) are skipped
 * (read when the job runs: a step-graph replay sees new ones).
 */
struct MoeArgs {
  const float* x;
  const int32_t* ids;
  const float* weights;
  float* out;
  int64_t T, H, I, K, E;
  int act;
  float alpha, limit;
  std::vector<MoeProjection> proj;
};

/** Runs the experts (re-runnable: scratch is the calling thread's, the arguments are only read). */
void moeForward(const MoeArgs& a, const KernelTable& kt, const QuantTable& qt);

/**
 * Sorts each row of x [rows, n] (f32) into values and int32 indices, stably; NaN sorts as the largest value, as the
 * TS reference's sort (and torch) do; descending puts the largest first.
 */
void sortRows(const float* x, float* values, int32_t* indices, int64_t rows, int64_t n, bool descending);

}  // namespace kiln
