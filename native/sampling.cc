// Batched sampling kernel (see sampling.h). Per random row, in the order of src/engine/sampler.ts:
//   temperature (l = f32(f64(l) * (1/T))) -> min_p -> top-k/top-p -> inverse-CDF draw with the row's uniform.
// Every step mirrors the JS arithmetic: logit differences, exp and running sums in double, sums in token-id
// order (except the top-p walk, which adds in descending value order as JS does; ties are equal addends),
// comparisons of f32 logits against double cuts. The only possible difference from the JS path is exp/log:
// glibc's may differ from V8's Math.exp/Math.log in the last ulp (~10% of exp arguments did: glibc 2.36,
// Node 20), so a draw (a top-p / min-p cut) can differ only when u*sum (top_p*total, max+log(min_p)) lands
// within ~1e-16 relative of a boundary. No fused multiply-add: no product here feeds an addition.
#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "thread-pool.h"

namespace kiln {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kLanes = 8;  // independent accumulators so the max/argmax scans vectorize

// Per-thread scratch, grown to the vocabulary on first use (pool threads live for the process).
struct Scratch {
  std::vector<float> candidates;  // finite logits: top-k / top-p selection
  std::vector<double> expDiff;    // exp(f64(l[v]) - f64(expMax)) for every token kept by top-k/top-p
  float expMax = 0;
  bool expValid = false;  // expDiff holds this row's values (set by top-p, read by the draw)
};
thread_local Scratch tScratch;

// Largest non-NaN value (JS: `if (x > m) m = x`); -inf for an all -inf / NaN row.
float maxOf(const float* l, int64_t n) {
  float m[kLanes];
  for (int i = 0; i < kLanes; ++i) m[i] = kNegInf;
  int64_t v = 0;
  for (; v + kLanes <= n; v += kLanes)
    for (int i = 0; i < kLanes; ++i) m[i] = l[v + i] > m[i] ? l[v + i] : m[i];
  float r = kNegInf;
  for (int i = 0; i < kLanes; ++i) r = m[i] > r ? m[i] : r;
  for (; v < n; ++v) r = l[v] > r ? l[v] : r;
  return r;
}

// JS argmax: lowest index of the largest value, with bv starting at l[0] (a NaN l[0] wins: nothing is > NaN).
int32_t argmaxRow(const float* l, int64_t n) {
  if (std::isnan(l[0])) return 0;
  const float m = maxOf(l, n);
  for (int64_t v = 0; v < n; ++v)
    if (l[v] == m) return static_cast<int32_t>(v);
  return 0;  // unreachable: l[0] is not NaN, so m is attained
}

void maskBelow(float* l, int64_t n, float cut) {
  for (int64_t v = 0; v < n; ++v) l[v] = l[v] < cut ? kNegInf : l[v];
}

// JS `l[v] *= inv` with inv a double: each product rounded to f32 once.
void scaleRow(float* l, int64_t n, double temperature) {
  const double inv = 1.0 / temperature;
  for (int64_t v = 0; v < n; ++v) l[v] = static_cast<float>(static_cast<double>(l[v]) * inv);
}

// min_p: drop l < max + log(minP), compared in double.
void applyMinP(float* l, int64_t n, double minP) {
  const double cut = static_cast<double>(maxOf(l, n)) + std::log(minP);
  for (int64_t v = 0; v < n; ++v) l[v] = static_cast<double>(l[v]) < cut ? kNegInf : l[v];
}

// Value bins below the row max, to pick a descending prefix of many candidates without sorting them: kBins
// equal bins over [max - range, max], range <= kBinRange (lower values share the last bin). bin(x) is
// monotone non-increasing in x, so {x : bin(x) <= b} is always a prefix of the candidates in descending order.
constexpr int kBins = 1024;
constexpr double kBinRange = 80;       // exp(-80) ~ 2e-35 of the max token's mass
constexpr int64_t kBinnedFrom = 4096;  // fewer candidates: plain selection is cheap enough

struct ValueBins {
  double max, scale;  // scale 0 (all candidates equal): every x is in bin 0
  ValueBins(float hi, float lo) : max(hi) {
    const double range = std::min(static_cast<double>(hi) - static_cast<double>(lo), kBinRange);
    scale = range > 0 ? kBins / range : 0;
  }
  int operator()(float x) const { return static_cast<int>(std::min((max - static_cast<double>(x)) * scale, kBins - 1.0)); }
};

// top-k then top-p with the semantics of applyTopKTopP in sampler.ts: the top-p walk adds exp(x - max) over
// the candidates in descending order (ties are equal addends, so any descending order gives the same sums)
// and stops at the first candidate where the mass walked before it is >= top_p x total. Only what is needed
// is ordered: the top-k selection runs on the bins holding the k largest; the top-p walk sorts the bins whose
// mass (summed in the total's pass) reaches the target, plus one against rounding, and if that falls short
// the chunked selection of the JS path continues after it. Leaves exp(l - max) of the candidates in sc.expDiff.
void applyTopKTopP(float* l, int64_t n, int32_t topK, double topP, Scratch& sc) {
  float* s = sc.candidates.data();
  int64_t count = 0;
  float max = kNegInf, min = std::numeric_limits<float>::infinity();
  bool nan = false;
  for (int64_t v = 0; v < n; ++v) {
    const float x = l[v];
    if (x > kNegInf) {
      s[count++] = x;
      max = x > max ? x : max;
      min = x < min ? x : min;
    } else if (x != x) {
      nan = true;
    }
  }
  if (count == 0) return;
  const std::greater<float> desc;
  int64_t m = count;  // candidates: s[0, m)
  float kth = kNegInf;
  if (topK > 0 && topK < count) {
    int64_t hi = count;  // s[0, hi) holds the topK largest
    if (count >= kBinnedFrom) {
      const ValueBins bin(max, min);
      int64_t counts[kBins] = {};
      for (int64_t j = 0; j < count; ++j) ++counts[bin(s[j])];
      int last = 0;
      for (int64_t acc = counts[0]; acc < topK; acc += counts[++last]) {
      }
      hi = std::partition(s, s + count, [&](float x) { return bin(x) <= last; }) - s;
    }
    std::nth_element(s, s + topK - 1, s + hi, desc);
    m = topK;
    kth = min = s[topK - 1];
  }
  if (topP >= 1) {
    if (kth > kNegInf) maskBelow(l, n, kth);
    return;
  }
  const bool binned = m >= kBinnedFrom;
  const ValueBins bin(max, min);
  double mass[kBins];
  if (binned) std::fill(mass, mass + kBins, 0.0);
  double* e = sc.expDiff.data();
  double total = 0;  // token-id order; a -inf token adds exp(-inf) = +0 in JS, so skipping it is exact
  for (int64_t v = 0; v < n; ++v) {
    const float x = l[v];
    if (x >= kth && x > kNegInf) {
      e[v] = std::exp(static_cast<double>(x) - static_cast<double>(max));
      total += e[v];
      if (binned) mass[bin(x)] += e[v];
    }
  }
  sc.expMax = max;
  sc.expValid = !nan;  // every token that survives the cut (>= kth) now has its exp cached
  const double target = topP * total;
  double cum = 0;
  float cut = s[0];
  int64_t done = 0;  // s[0, done) sorted descending and walked
  auto walkTo = [&](int64_t hi) {  // true when the walk stopped inside s[done, hi)
    for (int64_t j = done; j < hi; ++j) {
      if (cum >= target) return true;
      cut = s[j];
      cum += std::exp(static_cast<double>(cut) - static_cast<double>(max));
    }
    done = hi;
    return false;
  };
  bool stopped = false;
  if (binned) {
    int last = 0;
    for (double acc = mass[0]; acc < target && last < kBins - 1; acc += mass[++last]) {
    }
    last = std::min(last + 1, kBins - 1);
    const int64_t hi = std::partition(s, s + m, [&](float x) { return bin(x) <= last; }) - s;
    std::sort(s, s + hi, desc);
    stopped = walkTo(hi);
  }
  while (!stopped && done < m) {
    const int64_t hi = std::min(m, done + std::max<int64_t>(done, 64));  // chunks of 64, then doubling
    if (hi < m) std::nth_element(s + done, s + hi - 1, s + m, desc);
    std::sort(s + done, s + hi, desc);
    stopped = walkTo(hi);
  }
  maskBelow(l, n, cut);
}

// Inverse CDF in token-id order; returns the last finite token when u*sum lands past the final sum.
int32_t drawRow(const float* l, int64_t n, double u, Scratch& sc) {
  const float max = maxOf(l, n);
  double* e = sc.expDiff.data();
  double sum = 0;
  if (sc.expValid && max == sc.expMax) {
    for (int64_t v = 0; v < n; ++v) sum += l[v] == kNegInf ? 0.0 : e[v];
  } else {
    for (int64_t v = 0; v < n; ++v) {
      if (l[v] == kNegInf) continue;  // exp(-inf - max) = +0 (an all -inf row draws 0 either way)
      e[v] = std::exp(static_cast<double>(l[v]) - static_cast<double>(max));
      sum += e[v];
    }
  }
  const double target = u * sum;
  double cum = 0;
  int64_t last = 0;
  for (int64_t v = 0; v < n; ++v) {
    if (l[v] == kNegInf) continue;
    cum += e[v];
    last = v;
    if (cum > target) return static_cast<int32_t>(v);
  }
  return static_cast<int32_t>(last);
}

void sampleRow(const SampleRowsArgs& a, int64_t r) {
  float* l = a.logits + r * a.vocab;
  const int64_t n = a.vocab;
  const bool greedy = a.temperature[r] == 0;
  if (a.stages & kSampleScale) {
    if (greedy) {
      a.out[r] = argmaxRow(l, n);
    } else if (a.temperature[r] != 1) {
      scaleRow(l, n, a.temperature[r]);
    }
  }
  if (!(a.stages & kSampleDraw) || greedy) return;
  Scratch& sc = tScratch;
  if (static_cast<int64_t>(sc.candidates.size()) < n) {
    sc.candidates.resize(n);
    sc.expDiff.resize(n);
  }
  sc.expValid = false;
  if (a.minP[r] > 0) applyMinP(l, n, a.minP[r]);
  if (a.topK[r] > 0 || a.topP[r] < 1) applyTopKTopP(l, n, a.topK[r], a.topP[r], sc);
  a.out[r] = drawRow(l, n, a.uniform[r], sc);
}

}  // namespace

void sampleRows(const SampleRowsArgs& a) {
  auto row = [&a](int64_t r) { sampleRow(a, r); };
  // one row per chunk (rows differ a lot in cost: argmax vs a full exp pass); tiny batches stay inline
  parallelChunks(a.rows, row, a.rows * a.vocab < 32768 ? 1 : 0);
}

}  // namespace kiln
