// Kernel lab: what bounds the int8 group-32 decode tile (native/quant-impl.inc g8Tile) when its weights stream
// from DRAM. One LM-head-sized product (49152 x 576, SmolLM-135M's) in four cold copies, 2 threads, each thread's
// half of the rows read as 4 streams with the tile's prefetches; in one process, alternating, each round's best of 8:
//   tile     a copy of g8Tile (xor, dot product, conversion, permute, FMA per row and 64-byte line)
//   noxor    without the xor            noperm  without the permute (scales unspread: wrong sums, same reads)
//   ideal    2 instructions per line: dot products summed in int32 over 8 lines, then one conversion and FMA (what a
//            layout interleaving 16 groups' bytes would allow; wrong sums here, same reads)
//   read     the same loads and prefetches, summed (no dot products)
//   codes    the tile's code loads only: no scale loads or prefetches (6% fewer bytes)
//   blocked  the tile over another layout of the same bytes: every 16 rows' scales (K bytes) ahead of their codes
// If instructions bounded the tile, noxor / noperm / ideal would beat it; if the layout of the scales did, codes and
// blocked would. Prints GB/s (codes and scales over the time, for every variant) and this run's read bandwidth.
// Built and run by `npm run bench:g8-variants -- [rounds]` (x86-64 with AVX-512 VNNI; not part of the tests).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels.h"
#include "lab-memory.h"
#include "thread-pool.h"

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kN = 49152, kK = 576, kAhead = 1536, kCopies = 4;
constexpr int64_t kCodeBytes = kN * kK, kBytes = kCodeBytes + kN * (kK / 16);

inline void ahead(const void* p, int64_t bytes) { __builtin_prefetch(static_cast<const char*>(p) + bytes, 0, 2); }

enum Variant { kTile, kNoXor, kNoPerm, kIdeal, kRead, kCodes, kBlocked, kVariants };
const char* const kNames[kVariants] = {"tile", "noxor", "noperm", "ideal", "read", "codes", "blocked"};

// Rows w[j] / scales s[j] of 4 streams; V picks what each line costs (see the top).
template <int V>
void tile4(const int8_t* xq, const float* cs, const uint8_t* const* w, const uint16_t* const* s, float* out) {
  constexpr int NB = 4;
  __m512 acc[NB];
  for (int j = 0; j < NB; ++j) acc[j] = _mm512_setzero_ps();
  const __m512i bias8 = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i pairIdx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const int64_t chunks = kK / 64;
  for (int64_t c0 = 0; c0 < chunks; c0 += 8) {
    const int64_t nc = std::min<int64_t>(8, chunks - c0);
    const __mmask16 gm = nc == 8 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (2 * nc)) - 1);
    const __m512 cv = _mm512_loadu_ps(cs + c0 * 2);
    __m512 s16[NB];
    for (int j = 0; j < NB; ++j) {
      if (V == kCodes) {
        s16[j] = cv;
        continue;
      }
      if (V != kBlocked) ahead(s[j] + c0 * 2, kAhead / 16);  // blocked: the scales ride in the codes' stream
      s16[j] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(gm, s[j] + c0 * 2));
      if (V != kIdeal) acc[j] = _mm512_fmadd_ps(s16[j], cv, acc[j]);
    }
    __m512i sum[NB];
    for (int j = 0; j < NB; ++j) sum[j] = _mm512_setzero_si512();
    for (int64_t cc = 0; cc < nc; ++cc) {
      const int64_t c = c0 + cc;
      const __m512i idx = _mm512_add_epi32(pairIdx, _mm512_set1_epi32(static_cast<int>(2 * cc)));
      const __m512i xv = _mm512_loadu_si512(xq + c * 64);
      for (int j = 0; j < NB; ++j) {
        ahead(w[j] + c * 64, kAhead);
        const __m512i wl = _mm512_loadu_si512(w[j] + c * 64);
        if (V == kRead) {
          sum[j] = _mm512_add_epi32(sum[j], wl);
        } else if (V == kIdeal) {
          sum[j] = _mm512_dpbusd_epi32(sum[j], wl, xv);
        } else {
          const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), V == kNoXor ? wl : _mm512_xor_si512(wl, bias8), xv);
          const __m512 sc = V == kNoPerm ? s16[j] : _mm512_permutexvar_ps(idx, s16[j]);
          acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc, acc[j]);
        }
      }
    }
    if (V == kRead || V == kIdeal)
      for (int j = 0; j < NB; ++j) acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[j]), s16[j], acc[j]);
  }
  for (int j = 0; j < NB; ++j) out[j] = _mm512_reduce_add_ps(acc[j]);
}

struct Job {
  const int8_t* xq;
  const float* cs;
  const char* base;
  float* out;
  int variant;
};
// Row r's codes and scales: one region each (blocked: 16-row blocks of scales then codes).
const uint8_t* codesOf(const Job& j, int64_t r) {
  const char* b = j.base;
  return reinterpret_cast<const uint8_t*>(j.variant == kBlocked ? b + (r / 16) * 17 * kK + kK + (r % 16) * kK : b + r * kK);
}
const uint16_t* scalesOf(const Job& j, int64_t r) {
  const char* b = j.base;
  return reinterpret_cast<const uint16_t*>(j.variant == kBlocked ? b + (r / 16) * 17 * kK + (r % 16) * (kK / 16)
                                                                 : b + kCodeBytes + r * (kK / 16));
}
template <int V>
void share(const Job& j, int64_t lo, int64_t hi) {
  const int64_t per = (hi - lo) / 4;
  for (int64_t i = 0; i < per; ++i) {
    const uint8_t* w[4];
    const uint16_t* s[4];
    for (int k = 0; k < 4; ++k) w[k] = codesOf(j, lo + i + k * per), s[k] = scalesOf(j, lo + i + k * per);
    float o[4];
    tile4<V>(j.xq, j.cs, w, s, o);
    for (int k = 0; k < 4; ++k) j.out[lo + i + k * per] = o[k];
  }
}
void runShare(void* p, int64_t lo, int64_t hi) {
  const Job& j = *static_cast<const Job*>(p);
  switch (j.variant) {
    case kTile: share<kTile>(j, lo, hi); break;
    case kNoXor: share<kNoXor>(j, lo, hi); break;
    case kNoPerm: share<kNoPerm>(j, lo, hi); break;
    case kIdeal: share<kIdeal>(j, lo, hi); break;
    case kRead: share<kRead>(j, lo, hi); break;
    case kCodes: share<kCodes>(j, lo, hi); break;
    default: share<kBlocked>(j, lo, hi); break;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? atoi(argv[1]) : 10;
  // copies 0..3 in today's layout, 4..7 blocked; codes: any bytes; scales: f16 2^-7
  std::vector<char*> copies;
  for (int c = 0; c < 2 * kCopies; ++c) {
    char* p = static_cast<char*>(hugeAlloc(kBytes + 4096));
    for (int64_t i = 0; i < kBytes; ++i) p[i] = static_cast<char>((i * 7919) % 251);
    const Job j{nullptr, nullptr, p, nullptr, c < kCopies ? kTile : kBlocked};
    for (int64_t r = 0; r < kN; ++r) {
      uint16_t* s = const_cast<uint16_t*>(scalesOf(j, r));
      for (int g = 0; g < kK / 32; ++g) s[g] = 0x2000;
    }
    copies.push_back(p);
  }
  std::vector<int8_t> xq(kK);
  for (int64_t i = 0; i < kK; ++i) xq[i] = static_cast<int8_t>(i % 23 - 11);
  std::vector<float> cs(kK / 32 + 16, -128.0f), out(kN);
  const size_t probeBytes = size_t{256} << 20;
  const void* probe = hugeAlloc(probeBytes);
  const int64_t probeLen = static_cast<int64_t>(probeBytes);
  printf("LM-head-sized int8 group-32 product (%lld x %lld, %.1f MiB), %d threads; GB/s, best of 8 per round\n",
         static_cast<long long>(kN), static_cast<long long>(kK), kBytes / 1048576.0, poolGetNumThreads());
  for (int r = 0; r < rounds; ++r) {
    const double bw = kAvx512Bf16Kernels.memoryReadBandwidth(&probe, &probeLen, 1, 2, poolGetNumThreads());
    double best[kVariants];
    std::fill(best, best + kVariants, 1e30);
    for (int it = 0; it < 8; ++it)
      for (int v = 0; v < kVariants; ++v) {
        Job j{xq.data(), cs.data(), copies[(v == kBlocked ? kCopies : 0) + (it + v) % kCopies], out.data(), v};
        const auto t0 = Clock::now();
        poolRunRows(nullptr, kN, 64, runShare, &j);
        best[v] = std::min(best[v], std::chrono::duration<double>(Clock::now() - t0).count());
      }
    printf("probe %5.1f |", bw);
    for (int v = 0; v < kVariants; ++v) printf(" %s %5.1f", kNames[v], kBytes / best[v] / 1e9);
    printf("\n");
  }
}
