// Kernel lab: a decode step's chain of M = 1 matmuls, timed outside the engine. The weights of a SmolLM-135M- or
// Llama-1B-shaped model (q, k, v, o, gate, up, down per layer, then the LM head) lie in one huge-page arena in the
// order a step reads them; each round times the whole chain with the addon's own kernels (q/k/v and gate/up as
// grouped products, x pre-quantized as rmsNormQuant leaves it) and, interleaved with it, a plain read of the same
// bytes (each product's span split between the threads by poolRunRows as the kernels split it, each share read as
// four sequential streams), and prints both against this run's read bandwidth (the probe bench/serving divides by).
// chain/read well above 1 points at the kernels (the tiles' loads keeping too few lines in flight was one such
// cause: see lineAhead in native/quant-impl.inc), read/probe well below 1 at the split, the dispatch or the memory
// system's moment. Last, the arena read as one job (as bench/serving's roofline probe reads a model's weights): the
// gap to `read` is what splitting the step into its products costs. SmolLM Q8_0 (cache-resident on this VM): one job
// 2.37-2.44 ms, read 2.69-2.92, chain 2.75-2.87; in a lab loop over the same bytes in 16, 211 and 1024 equal jobs
// (poolRunRows, 4 prefetched streams per share) each job cost 1.16-1.35 us over the 16-job time, against 0.65-0.74 us
// with a bare 2-thread hand-off (one published sequence number, one claim word, one done word). Built and run by `npm run bench:chain -- [smollm|1b] [int8|int8_g32|int4|mxfp4|bf16] [rounds]`
// (x86-64 with AVX-512 VNNI and BF16; not part of the tests).
// Each round prints its bests and, under them, its medians: bench/serving divides a mean over steps by a best-of
// probe. SmolLM int8_g32 with the probe at 33-37 GB/s: chain medians 85-100% of the probe, read 87-102%; bf16
// 81-91% and 82-92%; with the probe at 65-76 GB/s the int8_g32 chain's medians 64-74%, read 72-96%.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels.h"
#include "lab-memory.h"
#include "quant.h"
#include "thread-pool.h"

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

struct Weight {
  int64_t N, K;
  uint8_t* data;
  void* scales;
  int32_t* rowSums;
  size_t bytes;  // data + scales (+ row sums) read per product
  std::vector<float> out;
};

// Bytes per row of codes and of scales (int8: f32 scale + int32 row sum) for each scheme; bf16 has no scales.
int64_t rowBytes(int scheme, int64_t K) {
  return scheme == kQuantInt4 || scheme == kQuantMxfp4 ? K / 2 : scheme < 0 ? 2 * K : K;
}
int64_t scaleBytes(int scheme, int64_t K) {
  return scheme < 0 ? 0 : scheme == kQuantInt8 ? 8 : scheme == kQuantMxfp4 ? K / 32 : K / 16;
}

double ms(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

}  // namespace

int main(int argc, char** argv) {
  const std::string model = argc > 1 ? argv[1] : "smollm", format = argc > 2 ? argv[2] : "int8_g32";
  const int rounds = argc > 3 ? atoi(argv[3]) : 5;
  const bool big = model == "1b";
  const int64_t dim = big ? 2048 : 576, kv = big ? 512 : 192, ff = big ? 8192 : 1536, layers = big ? 16 : 30;
  const int64_t vocab = big ? 128256 : 49152;
  const int scheme = format == "int8" ? kQuantInt8 : format == "int4" ? kQuantInt4 : format == "mxfp4" ? kQuantMxfp4
                   : format == "bf16" ? -1 : kQuantInt8G32;
  const QuantTable& Q = kQuantAvx512;
  const KernelTable& T = kAvx512Bf16Kernels;

  std::vector<std::pair<int64_t, int64_t>> shapes;  // [N, K] in the order a step reads them
  for (int64_t l = 0; l < layers; ++l)
    for (auto s : {std::make_pair(dim, dim), {kv, dim}, {kv, dim}, {dim, dim}, {ff, dim}, {ff, dim}, {dim, ff}})
      shapes.push_back(s);
  shapes.push_back({vocab, dim});
  size_t total = 0;
  for (auto [N, K] : shapes) total += static_cast<size_t>(N * (rowBytes(scheme, K) + scaleBytes(scheme, K))) + 8192;
  char* arena = static_cast<char*>(hugeAlloc(total));
  std::vector<Weight> ws;
  size_t off = 0, stepBytes = 0;
  for (auto [N, K] : shapes) {
    Weight w{N, K, reinterpret_cast<uint8_t*>(arena + off), nullptr, nullptr, 0, std::vector<float>(N)};
    const int64_t rb = rowBytes(scheme, K), sb = scaleBytes(scheme, K);
    for (int64_t i = 0; i < N * rb; ++i) w.data[i] = static_cast<uint8_t>((i * 7919) % 251);  // codes: any bytes
    off = (off + N * rb + 63) / 64 * 64;
    w.scales = arena + off;
    if (scheme == kQuantInt8) {
      auto* sc = static_cast<float*>(w.scales);
      w.rowSums = reinterpret_cast<int32_t*>(sc + N);
      for (int64_t n = 0; n < N; ++n) sc[n] = 0.01f, w.rowSums[n] = 0;
    } else if (scheme == kQuantMxfp4) {
      memset(w.scales, 120, N * (K / 32));
    } else if (scheme >= 0) {
      auto* sc = static_cast<uint16_t*>(w.scales);
      for (int64_t g = 0; g < N * (K / 32); ++g) sc[g] = 0x2000;  // f16 2^-7
    } else {
      auto* b = reinterpret_cast<uint16_t*>(w.data);
      for (int64_t i = 0; i < N * K; ++i) b[i] = static_cast<uint16_t>(0x3c00 + i % 127);  // bf16 in [0.0078, 0.016)
    }
    off = (off + N * sb + 4095) / 4096 * 4096;
    w.bytes = static_cast<size_t>(N * (rb + sb));
    stepBytes += w.bytes;
    ws.push_back(std::move(w));
  }

  std::vector<float> x(ff);
  for (int64_t i = 0; i < ff; ++i) x[i] = std::sin(0.3f * i);
  std::vector<int8_t> xq(ff);
  float xs = 0;
  auto qargs = [&](Weight& w) {
    return QuantMatmulArgs{x.data(), w.data, w.scales, w.rowSums, w.out.data(), 1, w.N, w.K, scheme, xq.data(), &xs};
  };
  auto margs = [&](Weight& w) {
    MatmulArgs a{};
    a.a = x.data(), a.b = w.data, a.out = w.out.data(), a.M = 1, a.N = w.N, a.K = w.K;
    a.bTransposed = true, a.bDtype = 1, a.batch = 1;
    return a;
  };
  // One step: per layer q/k/v grouped, o, gate/up grouped, down; then the head.
  auto chain = [&] {
    size_t i = 0;
    auto group = [&](int n) {
      if (scheme < 0) {
        MatmulArgs as[3];
        for (int j = 0; j < n; ++j) as[j] = margs(ws[i + j]);
        n == 1 ? T.matmul(as[0]) : T.gemvGroup(as, n);
      } else {
        QuantMatmulArgs as[3];
        for (int j = 0; j < n; ++j) as[j] = qargs(ws[i + j]);
        n == 1 ? Q.matmul(as[0]) : Q.matmulGroup(as, n);
      }
      i += n;
    };
    for (int64_t l = 0; l < layers; ++l) {
      if (scheme >= 0) Q.quantizeRows(x.data(), 1, dim, xq.data(), &xs);
      group(3), group(1), group(2);
      if (scheme >= 0) Q.quantizeRows(x.data(), 1, ff, xq.data(), &xs);
      group(1);
    }
    if (scheme >= 0) Q.quantizeRows(x.data(), 1, dim, xq.data(), &xs);
    group(1);
  };
  // The same bytes, summed: each product's weights (q/k/v and gate/up as one span, as the kernels stack them; they
  // lie adjacent in the arena) split between the threads by poolRunRows, each share read as 4 sequential streams.
  auto read = [&] {
    size_t i = 0;
    auto span = [&](int n) {
      const char* b = reinterpret_cast<const char*>(ws[i].data);
      const char* e = i + n < ws.size() ? reinterpret_cast<const char*>(ws[i + n].data) : arena + off;
      i += n;
      struct Ctx {
        const char* b;
        long sink;
      } c{b, 0};
      poolRunRows(b, (e - b) / 64, 64, [](void* p, int64_t lo, int64_t hi) {
        Ctx& c = *static_cast<Ctx*>(p);
        const char* d = c.b + lo * 64;
        const int64_t lane = (hi - lo) / 4 * 64;
        __m512i a = _mm512_setzero_si512(), b = a;
        for (int64_t o = 0; o < lane; o += 64) {
          a = _mm512_add_epi32(a, _mm512_loadu_si512(d + o));
          b = _mm512_add_epi32(b, _mm512_loadu_si512(d + lane + o));
          a = _mm512_add_epi32(a, _mm512_loadu_si512(d + 2 * lane + o));
          b = _mm512_add_epi32(b, _mm512_loadu_si512(d + 3 * lane + o));
        }
        c.sink += _mm512_reduce_add_epi32(_mm512_add_epi32(a, b));
      }, &c);
    };
    for (int64_t l = 0; l < layers; ++l) span(3), span(1), span(2), span(1);
    span(1);
  };

  const size_t probeBytes = size_t{256} << 20;
  const float* probe = static_cast<const float*>(hugeAlloc(probeBytes));
  printf("%s %s: %zu weights, %.1f MiB per step, %d threads\n", model.c_str(), format.c_str(), ws.size(),
         stepBytes / 1048576.0, poolGetNumThreads());
  for (int r = 0; r < rounds; ++r) {
    const void* probeRange[] = {probe};
    const int64_t probeLen[] = {static_cast<int64_t>(probeBytes)};
    const double bw = T.memoryReadBandwidth(probeRange, probeLen, 1, 2, poolGetNumThreads());
    std::vector<double> chainMs, readMs;
    for (int i = 0; i < 20; ++i) {
      auto t0 = Clock::now();
      chain();
      chainMs.push_back(ms(t0));
      t0 = Clock::now();
      read();
      readMs.push_back(ms(t0));
    }
    std::sort(chainMs.begin(), chainMs.end());
    std::sort(readMs.begin(), readMs.end());
    const double bestChain = chainMs[0], bestRead = readMs[0], medianChain = chainMs[10], medianRead = readMs[10];
    // the same bytes as one job, as bench/serving's roofline probe reads a model's weights (no split per product)
    const void* arenaRange[] = {arena};
    const int64_t arenaLen[] = {static_cast<int64_t>(off)};
    const double whole = T.memoryReadBandwidth(arenaRange, arenaLen, 1, 3, poolGetNumThreads());
    const double gbs = stepBytes / bestChain / 1e6, rgbs = stepBytes / bestRead / 1e6;
    printf("probe %5.1f GB/s | chain %7.3f ms %5.1f GB/s (%3.0f%% of probe) | read %7.3f ms (%3.0f%%) | "
           "chain/read %.2f | the arena as one job %5.1f GB/s: %7.3f ms\n",
           bw, bestChain, gbs, 100 * gbs / bw, bestRead, 100 * rgbs / bw, bestChain / bestRead, whole, stepBytes / whole / 1e6);
    // the bests above against the medians: bench/serving's tokens/s is a mean over steps, its probe a best
    printf("      medians: chain %7.3f ms (%3.0f%% of probe) | read %7.3f ms (%3.0f%%) | chain/read %.2f\n", medianChain,
           100 * stepBytes / medianChain / 1e6 / bw, medianRead, 100 * stepBytes / medianRead / 1e6 / bw, medianChain / medianRead);
  }
}
