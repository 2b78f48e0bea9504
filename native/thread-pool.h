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

}  // namespace kiln
