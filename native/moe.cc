// Mixture of experts without a host round trip (see moe.h). The routing (router linear, softmax, topk on sortRows,
// renormalisation) runs as ordinary stream jobs; moeForward reads the chosen ids and weights when it runs, groups the
// tokens by expert (a counting sort), and per expert with tokens gathers their rows and runs gate/up, the
// activation and down on the matmul / quant-matmul kernels (one row: gate and up as one parallel group, as a step
// graph merges a dense MLP's), adding each row's weighted output into out.
#include "moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace kiln {
namespace {

// Per-thread scratch (the stream thread, or the JS thread for a synchronous call); grows, never shrinks.
struct Scratch {
  std::vector<int64_t> count, start;
  std::vector<int32_t> rows;
  std::vector<float> rowWeight, xe, gate, up, h, y;
};
thread_local Scratch tScratch;

MatmulArgs floatArgs(const MoeProjection& p, const float* x, float* out, int64_t M, int64_t N, int64_t K) {
  MatmulArgs m{};
  m.a = x;
  m.b = p.w;
  m.out = out;
  m.M = M, m.N = N, m.K = K;
  m.bTransposed = true;
  m.aTransposed = false;
  m.bDtype = p.kind;
  m.batch = 1, m.strideA = M * K, m.strideB = N * K, m.strideOut = M * N;
  return m;
}

QuantMatmulArgs quantArgs(const MoeProjection& p, const float* x, float* out, int64_t M, int64_t N, int64_t K) {
  QuantMatmulArgs q{};
  q.x = x;
  q.w = p.w;
  q.scales = p.scales;
  q.rowSums = p.rowSums;
  q.out = out;
  q.M = M, q.N = N, q.K = K;
  q.scheme = p.scheme;
  q.xq = nullptr, q.xs = nullptr;
  return q;
}

void addBias(const MoeProjection& p, float* y, int64_t M, int64_t N) {
  if (!p.bias) return;
  for (int64_t r = 0; r < M; ++r)
    for (int64_t i = 0; i < N; ++i) y[r * N + i] += p.bias[i];
}

void project(const MoeProjection& p, const float* x, float* out, int64_t M, int64_t N, int64_t K, const KernelTable& kt,
             const QuantTable& qt) {
  if (p.kind == 2)
    runQuantMatmul(qt, kt, quantArgs(p, x, out, M, N, K));
  else
    kt.matmul(floatArgs(p, x, out, M, N, K));
  addBias(p, out, M, N);
}

// gate and up of the same rows; a single row runs both as one parallel group when the kernels take it
void projectPair(const MoeProjection& g, const MoeProjection& u, const float* x, float* gOut, float* uOut, int64_t M,
                 int64_t N, int64_t K, const KernelTable& kt, const QuantTable& qt) {
  if (g.kind == u.kind && g.kind < 2) {
    const MatmulArgs pair[2] = {floatArgs(g, x, gOut, M, N, K), floatArgs(u, x, uOut, M, N, K)};
    if (gemvGroupable(pair[0])) {
      kt.gemvGroup(pair, 2);
      addBias(g, gOut, M, N), addBias(u, uOut, M, N);
      return;
    }
  } else if (g.kind == 2 && u.kind == 2 && g.scheme == u.scheme) {
    const QuantMatmulArgs pair[2] = {quantArgs(g, x, gOut, M, N, K), quantArgs(u, x, uOut, M, N, K)};
    if (quantGroupable(pair[0])) {
      qt.matmulGroup(pair, 2);
      addBias(g, gOut, M, N), addBias(u, uOut, M, N);
      return;
    }
  }
  project(g, x, gOut, M, N, K, kt, qt);
  project(u, x, uOut, M, N, K, kt, qt);
}

}  // namespace

void moeForward(const MoeArgs& a, const KernelTable& kt, const QuantTable& qt) {
  const int64_t T = a.T, H = a.H, I = a.I, K = a.K, E = a.E;
  std::memset(a.out, 0, sizeof(float) * static_cast<size_t>(T * H));
  Scratch& s = tScratch;
  // counting sort of the (token, choice) pairs by expert; within an expert, tokens stay in order
  s.count.assign(static_cast<size_t>(E), 0);
  for (int64_t p = 0; p < T * K; ++p) {
    const int32_t e = a.ids[p];
    if (e >= 0 && e < E) ++s.count[e];
  }
  s.start.resize(static_cast<size_t>(E) + 1);
  s.start[0] = 0;
  for (int64_t e = 0; e < E; ++e) s.start[e + 1] = s.start[e] + s.count[e];
  const int64_t pairs = s.start[E];
  s.rows.resize(static_cast<size_t>(pairs));
  s.rowWeight.resize(static_cast<size_t>(pairs));
  std::fill(s.count.begin(), s.count.end(), 0);
  for (int64_t p = 0; p < T * K; ++p) {
    const int32_t e = a.ids[p];
    if (e < 0 || e >= E) continue;
    const int64_t at = s.start[e] + s.count[e]++;
    s.rows[at] = static_cast<int32_t>(p / K);
    s.rowWeight[at] = a.weights[p];
  }
  int64_t most = 0;
  for (int64_t e = 0; e < E; ++e) most = std::max(most, s.start[e + 1] - s.start[e]);
  s.xe.resize(static_cast<size_t>(most * H));
  s.gate.resize(static_cast<size_t>(most * I));
  s.up.resize(static_cast<size_t>(most * I));
  s.h.resize(static_cast<size_t>(most * I));
  s.y.resize(static_cast<size_t>(most * H));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t first = s.start[e], M = s.start[e + 1] - first;
    if (M == 0) continue;
    const int32_t* rows = s.rows.data() + first;
    // every token in order (decode with one sequence, or an expert all tokens chose): x itself, no gather
    bool identity = M == T;
    for (int64_t r = 0; identity && r < M; ++r) identity = rows[r] == r;
    const float* xe = a.x;
    if (!identity) {
      for (int64_t r = 0; r < M; ++r) std::memcpy(s.xe.data() + r * H, a.x + rows[r] * H, sizeof(float) * static_cast<size_t>(H));
      xe = s.xe.data();
    }
    const MoeProjection* p = a.proj.data() + 3 * e;
    projectPair(p[0], p[1], xe, s.gate.data(), s.up.data(), M, I, H, kt, qt);
    float* g = s.gate.data();
    const float* u = s.up.data();
    if (a.act == 0) {
      kt.siluMul(g, u, s.h.data(), M * I);
    } else {
      for (int64_t i = 0; i < M * I; ++i) {
        const float gc = std::min(g[i], a.limit);
        const float uc = std::min(std::max(u[i], -a.limit), a.limit);
        s.h[i] = (uc + 1.0f) * (gc / (1.0f + std::exp(-a.alpha * gc)));
      }
    }
    project(p[2], s.h.data(), s.y.data(), M, H, I, kt, qt);
    for (int64_t r = 0; r < M; ++r) {
      const float w = s.rowWeight[first + r];
      float* o = a.out + rows[r] * H;
      const float* y = s.y.data() + r * H;
      for (int64_t i = 0; i < H; ++i) o[i] += w * y[i];
    }
  }
}

void sortRows(const float* x, float* values, int32_t* indices, int64_t rows, int64_t n, bool descending) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * n;
    std::iota(order.begin(), order.end(), 0);
    auto key = [row](int32_t i) { return std::isnan(row[i]) ? INFINITY : row[i]; };
    if (descending)
      std::stable_sort(order.begin(), order.end(), [&](int32_t i, int32_t j) { return key(i) > key(j); });
    else
      std::stable_sort(order.begin(), order.end(), [&](int32_t i, int32_t j) { return key(i) < key(j); });
    for (int64_t i = 0; i < n; ++i) {
      values[r * n + i] = row[order[i]];
      indices[r * n + i] = order[i];
    }
  }
}

}  // namespace kiln
