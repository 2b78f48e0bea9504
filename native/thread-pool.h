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

// Rows [0, total) of a memory-bound job split into one contiguous share per pool thread (shares of at least
// minShare rows but the last): fn(ctx, lo, hi) runs once per share, the shares in parallel. With two threads and
// at least 2 * minShare rows the cut is learned per `key` (the job's weight): each run where the caller took the
// first share and the worker the second times both and moves the cut toward where they would have ended together.
// The two vCPUs of this project's VM need not read memory equally fast: timed per share in one high-bandwidth
// period (~65 GB/s), the worker read its half of every decode matmul 23-37% slower than the caller, so an even cut
// left the caller idle for a fifth of each matmul. (Whole decode steps with an even cut took x1.21 as long in such a
// period, measured over 8 alternating blocks; elsewhere the two were within noise.) Which rows a share gets never
// changes what is computed for a row.
// Bytes ahead of every line they load that the decode (small-M) tiles reading their share of rows as sequential
// streams prefetch each stream: the quantized tiles (native/quant-impl.inc kLineAhead, with the measurements) and
// the f32 / bf16 M = 1 tiles (small-m-impl.inc).
constexpr int64_t kStreamAheadBytes = 1536;
// Bytes an idle pool worker pulls into its cache (prefetcht1) while the caller runs serial work, until the next job
// is published: step graphs hint the worker's half of the next matmul's weights before the serial kernels ahead
// of it (stream.h Job::prefetch). Measured on the SmolLM-135M-shaped decode step (position 40, 2 threads, kernel by
// kernel, two runs each way): the output projection after attention 5.6-6.1 vs 6.8-7.3 us, attention 0.2-0.7 us
// slower; whole steps over 30 alternating in-process blocks, median ratio 0.987-0.993 (Q8_0) and 0.977 (bf16).
void poolPrefetchHint(const void* p, int64_t bytes);
// Side lines: lines a serial kernel will soon read, queued on the thread that will run it (step-graph replay: paged
// attention's cached K/V, queued before the q/k/v projection ahead of it, stream.h Job::warm) and prefetched
// kSideLinesPerTile at a time after each tile of the decode GEMV this thread runs meanwhile (sideAhead), so they
// arrive while that GEMV streams. SmolLM-135M-shaped Q8_0 decode step, position 40, kernel by kernel: attention
// 3.1-3.3 vs 5.2-5.4 us, the q/k/v projection 0.5-1 us slower; whole steps over 30 alternating in-process blocks:
// median ratio 0.985 at position 40, 0.993 at 24. Issued in one burst before that GEMV, the same prefetches changed
// nothing (attention 5.6 vs 5.7 us): with the core's miss buffers full, most were dropped.
constexpr int kSideLinesPerTile = 8;
struct SideLines {
  static constexpr int kRanges = 32;
  const char* p[kRanges];
  int64_t bytes[kRanges];
  int n = 0, i = 0;
  int64_t off = 0;
  void add(const void* q, int64_t b) {
    if (n < kRanges && b > 0) p[n] = static_cast<const char*>(q), bytes[n++] = b;
  }
  void clear() { n = i = 0, off = 0; }
};
SideLines* sideLines();  // this thread's queue
// Prefetches up to `lines` queued lines (into L2: they wait there while the GEMV's own lines pass through L1).
inline void sideAhead(SideLines* s, int lines) {
  for (; lines > 0 && s->i < s->n; --lines) {
    __builtin_prefetch(s->p[s->i] + s->off, 0, 2);
    if ((s->off += 64) >= s->bytes[s->i]) s->off = 0, ++s->i;
  }
}
using RangeFn = void (*)(void* ctx, int64_t lo, int64_t hi);
void poolRunRows(const void* key, int64_t total, int64_t minShare, RangeFn fn, void* ctx);

template <class F>
inline void parallelRows(const void* key, int64_t total, int64_t minShare, F& f) {
  if (total <= 0) return;
  poolRunRows(
      key, total, minShare, [](void* ctx, int64_t lo, int64_t hi) { (*static_cast<F*>(ctx))(lo, hi); }, &f);
}

// Rows of n weights stacked as one [sum of as[i].N] matrix, split as parallelRows splits rows (keyed by `key`):
// part(as[i], r0, r1) runs for the rows [r0, r1) of weight i that a share covers. With n = 1 this is the usual
// one-share-per-thread split of one weight's rows.
template <class A, class F>
inline void parallelStackedRows(const void* key, const A* as, int n, int64_t minShare, F&& part) {
  int64_t total = 0;
  for (int i = 0; i < n; ++i) total += as[i].N;
  auto rows = [&](int64_t lo, int64_t hi) {
    int64_t off = 0;
    for (int i = 0; i < n && off < hi; off += as[i].N, ++i) {
      const int64_t r0 = (lo > off ? lo : off) - off, r1 = (hi < off + as[i].N ? hi : off + as[i].N) - off;
      if (r0 < r1) part(as[i], r0, r1);
    }
  };
  parallelRows(key, total, minShare, rows);
}

}  // namespace kiln
