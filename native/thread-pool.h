// Persistent per-process worker pool. Work is a count of chunks claimed from a shared atomic
// counter; the calling thread participates, so a descheduled worker never stalls a job.
// Plain C-style interface (function pointer + context) so the ISA-specific translation
// units instantiate no shared templates (avoids ODR mixing of AVX-512 and portable code).
#pragma once
#include <cstdint>

namespace kiln {

using ChunkFn = void (*)(void* ctx, int64_t chunk);

// Runs fn(ctx, c) for c in [0, numChunks) using up to maxThreads threads (<=0: all).
// Returns when every chunk has finished.
void poolRun(int64_t numChunks, ChunkFn fn, void* ctx, int maxThreads = 0);
void poolSetNumThreads(int n);  // total threads including the caller; >= 1
int poolGetNumThreads();

// Helper for kernels: parallel over chunks with a lambda (instantiated per TU with
// internal-linkage lambda types, so no cross-ISA symbol sharing).
template <class F>
inline void parallelChunks(int64_t numChunks, F& f, int maxThreads = 0) {
  if (numChunks <= 0) return;
  if (numChunks == 1 || maxThreads == 1) {
    for (int64_t c = 0; c < numChunks; ++c) f(c);
    return;
  }
  poolRun(
      numChunks, [](void* ctx, int64_t c) { (*static_cast<F*>(ctx))(c); }, &f, maxThreads);
}

// Rows of n weights stacked as one [sum of as[i].N] matrix, split into one contiguous share per pool thread (at
// least minShare rows): part(as[i], r0, r1) runs for the rows [r0, r1) of weight i that a share covers, the shares
// in parallel. With n = 1 this is the usual one-share-per-thread split of one weight's rows.
template <class A, class F>
inline void parallelStackedRows(const A* as, int n, int64_t minShare, F&& part) {
  int64_t total = 0;
  for (int i = 0; i < n; ++i) total += as[i].N;
  if (total == 0) return;
  const int64_t threads = poolGetNumThreads();
  int64_t share = (total + threads - 1) / threads;
  if (share < minShare) share = minShare;
  auto chunk = [&](int64_t c) {
    const int64_t lo = c * share, hi = lo + share < total ? lo + share : total;
    int64_t off = 0;
    for (int i = 0; i < n && off < hi; off += as[i].N, ++i) {
      const int64_t r0 = (lo > off ? lo : off) - off, r1 = (hi < off + as[i].N ? hi : off + as[i].N) - off;
      if (r0 < r1) part(as[i], r0, r1);
    }
  };
  parallelChunks((total + share - 1) / share, chunk);
}

}  // namespace kiln
