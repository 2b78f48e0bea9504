// Persistent per-process worker pool. Work is a count of chunks claimed from a shared atomic
// counter; the calling thread participates, so a descheduled worker never stalls a job.
// Plain C-style interface (function pointer + context) so the ISA-specific translation
// units instantiate no shared templates (avoids ODR mixing of AVX-512 and portable code).
#pragma once
#include <atomic>
#include <cstdint>
#include <type_traits>

namespace kiln {

using ChunkFn = void (*)(void* ctx, int64_t chunk);

// Runs fn(ctx, c) for c in [0, numChunks) using up to maxThreads threads (<=0: all).
// Returns when every chunk has finished.
void poolRun(int64_t numChunks, ChunkFn fn, void* ctx, int maxThreads = 0);
void poolSetNumThreads(int n);  // total threads including the caller; >= 1
int poolGetNumThreads();
// Mean nanoseconds of one round trip of a cache line between two pool threads (0 with one thread; -1 when no second
// thread answered within 100 ms, as when another caller's job holds the pool): the least any hand-off between the
// threads of a job costs. On this project's 2-vCPU VM it also tells which of the VM's two memory regimes a
// measurement saw. A scratch copy, 100 times a 2-thread read of 256 MiB next to 100k round trips:
// the 74 reads at 31-45 GB/s came with round trips of 68 ns (median; 10th-90th percentile 48-74 ns), and 23 of the
// 26 reads at 55-61 GB/s with 307-398 ns (the other 3: 69-76 ns). So the fast-memory periods of earlier notes are,
// it seems, the two vCPUs placed far apart (more paths to memory, slower hand-offs between them), which is why a
// decode step's small products, a few hand-offs each, gained least in those periods (bench/step-profile).
double poolRoundTripNs(int iterations);

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
// How the decode (small-M) products run, chosen once per process for the CPU (thread-pool.cc chooseDecodeTuning):
// - The stream tiles reading a share of rows as sequential streams prefetch each stream quantAhead (the quantized
//   tiles, native/quant-impl.inc lineAhead, with the measurements) or gemvAhead (the f32 / bf16 M = 1 tiles,
//   small-m-impl.inc gemvPrefetch) bytes ahead of every line they load, into L1 (prefetcht0) or L2 (prefetcht1).
// - handOverMinBytes: parallelStackedSpans balances the two threads' shares while they run (poolRunShares, below)
//   in products of at least this many bytes; a smaller product takes runRows' learned cut alone.
// Zen 4 and every other CPU: 1536 / 1024 bytes into L2, every product handed over (the Zen 4 measurements at
// lineAhead, gemvPrefetch and poolRunShares).
// Zen 5 (AMD family 1Ah) and later: 2048 / 1024 bytes into L1, products under 4 MiB not handed over. Measured on a
// Zen 5 VM (2 vCPUs, a 2-thread read of ~70-105 GB/s, the threads' round trip 390-550 ns, against ~70 or ~300 ns on
// the Zen 4 VM):
// - the prefetch: bench/lab/gemv-chain with the setting switched between chains in one process, medians of 20 chains
//   per round: SmolLM-135M-shaped int8 group-32 chains took 0.87-0.93x the time of the Zen 4 setting's (prefetcht0
//   and prefetchnta alike at 2048; prefetcht0 at 1536 0.93-0.95x, at 1024 0.96-0.97x, at 4096 0.91x), 1B-shaped
//   0.91-0.92x, SmolLM-shaped bf16 0.92-0.94x, 1B-shaped bf16 0.96x, int4 and mxfp4 0.94-0.98x. Whole decode steps
//   (execute() at position 32, blocks of 15 alternating between the two settings in one process; median ratio of
//   the blocks, quartiles): SmolLM-135M Q8_0 0.933 (0.891-0.947, 30 blocks), bf16 0.939 (0.930-0.983, 20);
//   Llama-1B-shaped Q8_0 1.010 (0.968-1.026, 10), bf16 0.985 (0.941-0.985, 6).
//   The f32 / bf16 tiles then took 2048 too; 1024 into L1 beat it (session 24, the same whole-step blocks; ratio of
//   1024's time to 2048's): Llama-1B-shaped bf16 0.913 (0.910-0.926, 8 blocks), SmolLM-135M bf16 0.977 (0.900-1.009,
//   20); against 1024, 768 took 1.027x and 1536 ~1.03x (1B-shaped, 8 blocks). In a lab (a scratch copy of the tile
//   on 1B-shaped gate/up and down products, 2.3 GB of cold copies, best of 8 per round) 1024 read 78-86 GB/s against
//   2048's 69-83, ahead in each of 18 rounds. The quantized tiles keep 2048: 1024 took 1.046x (1B-shaped Q8_0, 10
//   blocks) and 1.115x (SmolLM-135M Q8_0, 30), 3072 1.105x and 0.999x.
// - the hand-over (the same whole-step blocks; ratio of the blocks' times without to with it): with no product
//   handed over, SmolLM-135M Q8_0 0.942 (0.896-0.983, 30 blocks), bf16 1.005 (0.951-1.019, 20), but Llama-1B-shaped
//   Q8_0 1.043 (1.010-1.112, 10) and bf16 1.073 (1.008-1.085, 6): a share's finishing gap grows with the product,
//   the hand-over's cost (several of those round trips) does not. With products under 4 MiB not handed over (every
//   SmolLM-135M product but the LM head, no 1B-shaped one): SmolLM-135M Q8_0 0.946 (0.900-0.961, 30), bf16 1.006
//   (0.962-1.087, 20), 1B-shaped Q8_0 1.011 (0.981-1.013, 10), bf16 0.998 (0.991-1.012, 6; these two in a period of
//   memory ~40% slower than the others').
// This Zen 5 VM, too, has periods with its vCPUs close: a bench run read ~50 GB/s with round trips of 56-67 ns. In
// one (round trips 56-62 ns), Zen 5's whole setting against Zen 4's, the same whole-step blocks: SmolLM-135M Q8_0
// 0.955 (0.891-0.983, 30), bf16 0.997 (0.973-1.013, 20), 1B-shaped Q8_0 0.971 (0.961-0.981, 10).
// The addon's decodeTuning() reads and sets it (for measuring one setting against another in one process).
struct DecodeTuning {
  int64_t quantAhead, gemvAhead;
  bool prefetchIntoL1;
  int64_t handOverMinBytes;
};
extern DecodeTuning gDecodeTuning;  // written only while no kernel runs
// Prefetches the line `ahead` bytes past p into the cache gDecodeTuning names.
inline void streamAhead(const void* p, int64_t ahead) {
  if (gDecodeTuning.prefetchIntoL1) __builtin_prefetch(static_cast<const char*>(p) + ahead, 0, 3);
  else __builtin_prefetch(static_cast<const char*>(p) + ahead, 0, 2);
}
// Bytes an idle pool worker pulls into its cache (prefetcht1) while the caller runs serial work, until the next job
// is published: step graphs hint the worker's half of the next matmul's weights before the serial kernels ahead
// of it (stream.h Job::prefetch). Measured on the SmolLM-135M-shaped decode step (position 40, 2 threads, kernel by
// kernel, two runs each way): the output projection after attention 5.6-6.1 vs 6.8-7.3 us, attention 0.2-0.7 us
// slower; whole steps over 30 alternating in-process blocks, median ratio 0.987-0.993 (Q8_0) and 0.977 (bf16).
// Hinting the caller's half as well (the worker prefetching the first 512 KiB of both halves in turn, for the caller
// to take from the worker's cache) took 1.036x the time per token: no gain (a scratch build switched at run time;
// SmolLM-135M Q8_0, generate, median of 24 alternating blocks of 64 tokens, quartiles 0.985-1.081). Nor did the
// caller prefetching its own half's stream heads (16 KiB each, queued as side lines) while it runs paged attention,
// the attention kernel taking 16 lines per key: the output projections' kernel medians summed 305-324 vs 311-321 us
// per step, attention 173-200 vs 152-159 us, whole steps 1.005x (a scratch build switched at run time; SmolLM-135M
// Q8_0 decode steps at position 40, 30 alternating blocks of 15 execute(), quartiles 0.973-1.035).
void poolPrefetchHint(const void* p, int64_t bytes);
// Side lines: lines a serial kernel will soon read, queued on the thread that will run it (step-graph replay: paged
// attention's cached K/V, queued before the q/k/v projection ahead of it, stream.h Job::warm) and prefetched
// kSideLinesPerTile at a time after each tile of the decode GEMV this thread runs meanwhile (sideAhead), so they
// arrive while that GEMV streams. SmolLM-135M-shaped Q8_0 decode step, position 40, kernel by kernel: attention
// 3.1-3.3 vs 5.2-5.4 us, the q/k/v projection 0.5-1 us slower; whole steps over 30 alternating in-process blocks:
// median ratio 0.985 at position 40, 0.993 at 24. Issued in one burst before that GEMV, the same prefetches changed
// nothing (attention 5.6 vs 5.7 us): with the core's miss buffers full, most were dropped.
// Queuing the head of the next GEMV's weights (up to 96 KiB, of its caller's half) on every GEMV but the q/k/v one,
// so that the next product would start from L2, did not pay (a scratch build switched at run time; SmolLM-135M decode
// steps, position 40, execute() in alternating blocks of 15: Q8_0 1.019x over 30 blocks, bf16 1.002x over 20, where
// identical builds read 0.984-1.024x).
// Spreading the whole queue over the span's tiles instead (at least 8 lines per tile), so that none of attention's
// K/V waits for it at longer contexts, did not pay either (session 53, the Zen 5 VM, vCPUs apart; a scratch build
// switched at run time, SmolLM-135M Q8_0 decode steps, 20 alternating blocks of 15 execute()): 0.998x the time at
// position 40, 0.992x at 60 and 1.052x (1.026-1.064) at 200 (where attention splits its keys between the threads, so
// the other thread, presumably, reads part of what the caller pulled into its own cache); 16 lines per tile
// 1.005-1.012x.
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

// ---------------------------------------------------------------- balanced row streams (2 threads)
// The learned cut above still left one thread waiting at the end of most decode matmuls: timed per run in the
// SmolLM-135M-shaped decode steps (2 threads, this VM), the shares ended 1.0-1.6 us apart on average (Q8_0, runs of
// ~22 us) and 2.8-4.5 us (bf16, ~55 us), both ways round: the two vCPUs' speeds wander from run to run, which no
// cut learned from past runs can follow. So a share is also handed over while it runs: the thread that finishes
// first asks the other for half of what it has left, which that thread grants between two tiles. Measured the same
// way (Q8_0): the shares now end 0.34-0.41 us apart; whole decode steps (bench/step-profile, 5 alternating runs
// per build, medians of 40 steps) took 3.40 vs 3.48 ms (Q8_0) and 7.70 vs 7.76 ms (bf16, 4 runs): within this VM's
// run-to-run noise. (On Zen 5, whose threads' round trips cost ~430 ns, only products of 4 MiB or more are handed
// over: DecodeTuning above.)
//
// RowSpan: `tiles` tiles of `streams` rows read in lockstep, tile i being the rows row + i + s * stride (s <
// streams; streams 1: stride 1). A thread's share of rows [r0, r1) of one weight is two spans (splitSpans): the
// sub-ranges in lockstep, then the few rows left over. While `stop` (the share's request flag) is not 1, a span
// runs to its end; else it returns after the tile in hand, so a request waits at most one tile.
struct RowSpan {
  int64_t row, stride, tiles;
  int streams;
  const std::atomic<int>* stop;
};
inline int splitSpans(int64_t r0, int64_t r1, int streams, const std::atomic<int>* stop, RowSpan out[2]) {
  const int64_t per = (r1 - r0) / streams;
  int n = 0;
  if (per > 0) out[n++] = {r0, per, per, streams, stop};
  if (r1 - r0 > per * streams) out[n++] = {r0 + per * streams, 1, r1 - r0 - per * streams, 1, stop};
  return n;
}
// Runs a span's tiles: tile(std::integral_constant<int, S or 1>, row, stride); after each, a few side lines.
// Returns the tiles run (fewer than sp.tiles only when stopped by a request).
template <int S, class Tile>
inline int64_t spanTiles(const RowSpan& sp, Tile&& tile) {
  SideLines* side = sideLines();
  const std::atomic<int>* stop = sp.stop;
  auto run = [&](auto width, int64_t stride) {
    for (int64_t i = 0; i < sp.tiles; ++i) {
      tile(width, sp.row + i, stride);
      sideAhead(side, kSideLinesPerTile);
      if (stop && stop->load(std::memory_order_relaxed) == 1) return i + 1;
    }
    return sp.tiles;
  };
  return sp.streams == S ? run(std::integral_constant<int, S>{}, sp.stride) : run(std::integral_constant<int, 1>{}, int64_t{1});
}

// Units of work of two shares, run on two threads with hand-over (see above): fn(ctx, share, i0, i1, stop) runs
// units [i0, i1) of a share in order and returns how many it ran (it may stop early only when *stop is 1; stop is
// null for units handed over, which run to their end). Each thread first runs a share as its owner (a share no
// thread has claimed goes to the first that asks), then takes halves of the other's remaining units while at
// least minGive remain. callerUnits[s] returns the units of share s that ran on the calling thread.
// A request waits for its owner's next tile, unless the owner has lost its core. Instrumented builds (not kept), in
// LLM.generate's decode of the SmolLM-135M-shaped Q8_0 model (~1000 steps per run): requests waited 1.5-2.3 us on
// average in two runs (0.2-0.7 us in bench/lab/gemv-chain); in the second, 74% of the wait was 370 waits over 50 us
// (430 us on average), while the JS thread's host work (~235 us of CPU per step, a third runnable thread on two
// vCPUs) ran. Sleeping (1 us naps) instead of spinning after 2000 pauses of a wait measured 1.01x the time per
// generated token (30 alternating rounds), and synchronous scheduling (host work between steps) the same as
// asynchronous (median 4.71 vs 4.73 ms per token). A busy loop of 400 (800) us added to each step's dispatch on
// the JS thread made a token take 1.029x (1.049x) the time (SmolLM-135M Q8_0 generate, 12 alternating rounds of 64
// tokens): the host's work costs the decode about a third of its CPU time.
// Where a product's time goes, per placement (a scratch copy of bench/lab/gemv-chain stamping each of the SmolLM-135M
// Q8_0 step's 121 products with the TSC on both threads, means over 16 chains per round): with the vCPUs close
// (round trip ~70 ns) the worker started 0.13-0.47 us after the job was published, the caller returned 0.3-1.1 us
// after the last share's end, and its own work between two products took 0.4-1.6 us; apart (~260-320 ns) those were
// 0.31-0.73, 0.75-1.96 and 1.3-2.7 us, and the small products' shares streamed slower per thread (q/k/v 19-23 GB/s,
// gate/up 24-28). In the same lab, chains alternating per configuration (300-400 of each, medians of the ratios per
// placement), none of these gained beyond the 0.4-2.2% that two copies of one configuration differed by: the job's
// descriptors (shares, SharesJob, the activation sums) taken from a ring of 16 instead of the same stack lines each
// product (close +0.3%, apart +0.9%); the worker prefetching the job's lines (listed by the caller) the moment it is
// published (close +1.7% and +0.8%, apart +1.4% and -0.8%: two copies); the int8 group-32 tile's activation sums by
// vpdpbusd instead of a scalar loop (+0.3%, -0.4%).
// Nor would a persistent step program, by the same lab: a worker thread of its own looping over the step's products,
// one flag each way per product (ready, done), a static cut per product learned from both sides' times, no job
// publication or hand-over. Against this pool's chain in alternating chains it ran 1.003x as fast with the vCPUs close
// (75 iterations) and 1.026x apart (48); with each side prefetching its next share's stream heads (6 KiB each) while
// it waits on the other, 1.000x close (283) and 1.055x apart (21).
// Nor, in the real step, a whole decoder layer as one job (session 30, a scratch build, SmolLM-135M Q8_0 generate on
// the Zen 5 VM, vCPUs apart): both threads ran the layer with four meetings (a gang job: each its query heads' q/k/v
// rows, K/V write and attention; meet; its rows of o; meet; its rows of gate/up; meet; its rows of down), the norms
// and activation quantizations on both alike. Per token 1.034x the separate kernels' time (median of 10 alternating
// rounds, quartiles 0.998-1.043). Timed per phase (TSC), each thread read its share at 26-34 GB/s, as the separate
// kernels' small products do: the hand-offs saved were repaid by the static cut (the worker ran each phase 10-45%
// slower than the caller, which then waited) and by the threads' products starting more often (each thread half of
// gate and then half of up took 67k cycles where all of gate took 51k). With o and down split by columns instead
// (two meetings per layer, partial sums added), a thread's columns are a strided slice of rows: o read at 14 GB/s.
// On the Zen 5 VM (session 24; its vCPUs apart, round trips ~430 ns), scratch labs found:
// - One thread reads ~40-47 GB/s, alone in a long product or in a chain of 352 KiB ones alike; two read ~100 in a
//   long product but 52-59 in that chain (SmolLM-135M-shaped o products, int8 group-32; each its own weight, so
//   their learned cuts had had few runs). So the small products lose their time between the threads, not in their
//   streams: instrumented in bench/lab/gemv-chain's SmolLM-135M int8 group-32 chain (runRows, its cuts learned over
//   the rounds), the caller started its share 0.2 us after the call, the worker 0.2 us after the caller, the shares
//   ended 0.8-2.1 us apart on average (the worker's 0.16 us after the caller's, signed: the gap is mostly noise no
//   learned cut can follow), and the caller returned 0.3 us after the later end.
// - Publishing the pair job with a release store (the caller no longer waiting for its seq_cst store) started the
//   caller's share 0.13-0.26 us sooner, the worker's no sooner: no gain per product (3 runs).
// - Tail shares instead of the hand-over (each share's last quarter or eighth claimed by CAS in halving blocks by
//   whichever thread got there; no thread waiting for a grant) took 1.04-1.13x the learned cut's time (chains
//   alternating, 12 rounds; 1.00-1.02x in 4 rounds of a close period): a contended claim costs a round trip as a
//   request does.
// - An early request instead (each thread, with an eighth or a quarter of its share left, asking the other for what
//   would end both shares together, answered between the owner's tiles while the asker works on; no waiting on the
//   asker when the owner closes) took 1.04-1.09x the learned cut's time (7 rounds): poolRunShares' own lines (claims,
//   requests) cost more round trips than the balance saves in products this small.
// - A tensor-parallel chain of the same bytes (each thread its half of a layer's heads and MLP rows, o and down split
//   by columns, partial sums added by the caller: two jobs per layer instead of four products) took 0.92-0.95x the
//   standard chain's time (best and median of 20, 4 rounds); each thread then read ~37 GB/s.
// Session 53, the same VM (apart, round trips ~450 ns): products under 640 KiB (SmolLM-135M's q/k/v and o) run on the
// caller alone, the worker meanwhile reading its half of the next larger product (gate/up, down) into its cache
// (hinted from the job after each larger product, up to 1 MiB, as prefetches or as loads of a byte per line), took
// 1.14-1.16x the time of the pair jobs (a scratch build switched at run time, SmolLM-135M Q8_0 decode steps at
// position 32, 20 alternating blocks of 15 execute()). Kernel by kernel, the step's 30 q/k/v products took 488 us
// against 320-331 us as pairs (the caller alone read ~36 GB/s, the pair ~54; one thread's probe read 31-44 GB/s that
// session) and o 257-260 against 187-193, while gate/up, its worker half hinted, took 619-634 us against 715-762:
// 96-128 us saved on gate/up, ~230 lost on the products one thread ran. Nor did the worker start on its hint (its half
// of the next product) the moment its share of a product was done, rather than when the caller's serial job after it
// published the hint, resuming there: 1.009x (0.994-1.036; position 32, 30 blocks).
// Session 54, the same VM: pinning the pool's threads (pthread_setaffinity_np: the caller to the first CPU, the worker
// to the second, applied at each thread's next job; a scratch build switched at run time) changed nothing. SmolLM-135M
// Q8_0 decode steps at position 32, 16-20 alternating blocks of 15 execute(), medians of the blocks' ratios:
// 0.986-1.009x the unpinned time in 9 runs with the vCPUs apart, 0.982-1.002x in 6 close; LLM.generate, 10-16
// alternating blocks of 64 tokens: 0.988-1.044x apart (8 runs), 0.995-1.023x close (4). A thread moved between the
// two CCDs' caches is not a cost worth pinning.
// Session 25, the same VM (apart, round trips 390-430 ns), scratch labs and in-process A/B blocks:
// - Keeping a fixed part of the weights in the last-level cache (kernels-impl.inc memoryReadBandwidth: a 136 MiB
//   model reads partly from it) did not pay: reading 143 MiB pass after pass on two threads, each thread's first
//   8-24 MiB prefetched into L1 and the rest with prefetchnta, took 1.035-1.055x the time of all into L1 (median of
//   20 rounds); evicting the streamed lines behind the reads (clflushopt) cost more than the kept part saved (every
//   line evicted 1.72x, all but 32 MiB per thread 1.34x).
// - Whole decode steps without software prefetch (ahead 0; blocks of 15 execute(), median ratio to the tuned
//   setting, quartiles): SmolLM-135M Q8_0 1.137 (1.123-1.153, 20 blocks); the bf16 tiles alone at 0, SmolLM-135M
//   bf16 0.991 (0.939-1.004, 16) and Llama-1B-shaped bf16 1.025 (1.022-1.027, 6).
using ShareFn = int64_t (*)(void* ctx, int share, int64_t i0, int64_t i1, const std::atomic<int>* stop);
void poolRunShares(const int64_t units[2], int64_t minGive, ShareFn fn, void* ctx, int64_t callerUnits[2]);
// runRows' learned cut for `key` (the caller's fraction of the rows, 0.5 for a new key), and its update from the
// fraction of the rows a run's caller actually ran (damped as runRows' own).
double poolSplitFraction(const void* key);
void poolLearnSplit(const void* key, double callerFraction);

// Rows of n weights stacked as one [sum of as[i].N] matrix, split between the threads as parallelRows splits rows
// (keyed by `key`), each share read as `streams` streams per weight it covers and, in a product of at least
// gDecodeTuning.handOverMinBytes (rows of rowBytes each), balanced while it runs (poolRunShares): part(as[i], span)
// runs a RowSpan of weight i's rows and returns the tiles it ran. Which thread computes a row never changes what is
// computed for it.
template <class A, class F>
inline void parallelStackedSpans(const void* key, const A* as, int n, int streams, int64_t minShare, int64_t rowBytes,
                                 F&& part) {
  constexpr int kMaxParts = 4;
  int64_t total = 0;
  for (int i = 0; i < n; ++i) total += as[i].N;
  if (total <= 0) return;
  // emit(i, span) for each span of the stacked rows [lo, hi): weight i's rows in it, split by splitSpans
  auto spansOf = [&](int64_t lo, int64_t hi, auto&& emit) {
    int64_t off = 0;
    for (int i = 0; i < n && off < hi; off += as[i].N, ++i) {
      const int64_t r0 = (lo > off ? lo : off) - off, r1 = (hi < off + as[i].N ? hi : off + as[i].N) - off;
      RowSpan sp[2];
      for (int k = 0, ns = r0 < r1 ? splitSpans(r0, r1, streams, nullptr, sp) : 0; k < ns; ++k) emit(i, sp[k]);
    }
  };
  if (total * rowBytes < gDecodeTuning.handOverMinBytes || poolGetNumThreads() != 2 || n > kMaxParts ||
      total < 2 * minShare) {  // the unbalanced split
    auto rows = [&](int64_t lo, int64_t hi) { spansOf(lo, hi, [&](int i, const RowSpan& sp) { part(as[i], sp); }); };
    parallelRows(key, total, minShare, rows);
    return;
  }
  int64_t cut = static_cast<int64_t>(static_cast<double>(total) * poolSplitFraction(key) + 0.5);
  if (cut < minShare) cut = minShare;
  if (cut > total - minShare) cut = total - minShare;
  // Each share: its spans in order (at most two per weight), units = tiles.
  struct Seg {
    int part;
    RowSpan span;
    int64_t first;  // the share's unit index of its first tile
  };
  struct Share {
    Seg seg[2 * kMaxParts];
    int n = 0;
    int64_t units = 0, rows = 0;
  } shares[2];
  for (int s = 0; s < 2; ++s) {
    const int64_t lo = s == 0 ? 0 : cut, hi = s == 0 ? cut : total;
    Share& sh = shares[s];
    sh.rows = hi - lo;
    spansOf(lo, hi, [&](int i, const RowSpan& sp) {
      sh.seg[sh.n++] = {i, sp, sh.units};
      sh.units += sp.tiles;
    });
  }
  struct Ctx {
    const A* as;
    std::remove_reference_t<F>* part;
    Share* shares;
  } ctx{as, &part, shares};
  ShareFn fn = [](void* c, int s, int64_t i0, int64_t i1, const std::atomic<int>* stop) -> int64_t {
    const Ctx& x = *static_cast<Ctx*>(c);
    const Share& sh = x.shares[s];
    int64_t ran = 0;
    for (int k = 0; k < sh.n && i0 < i1; ++k) {
      const Seg& g = sh.seg[k];
      const int64_t a = i0 > g.first ? i0 : g.first, b = i1 < g.first + g.span.tiles ? i1 : g.first + g.span.tiles;
      if (a >= b) continue;
      const RowSpan sp{g.span.row + (a - g.first), g.span.stride, b - a, g.span.streams, stop};
      const int64_t done = (*x.part)(x.as[g.part], sp);
      ran += done;
      if (done < b - a) return ran;
    }
    return ran;
  };
  const int64_t units[2] = {shares[0].units, shares[1].units};
  int64_t mine[2] = {0, 0};
  poolRunShares(units, 2, fn, &ctx, mine);
  double callerRows = 0;
  for (int s = 0; s < 2; ++s)
    if (units[s] > 0) callerRows += static_cast<double>(shares[s].rows) * static_cast<double>(mine[s]) / static_cast<double>(units[s]);
  if (callerRows > 0 && callerRows < static_cast<double>(total)) poolLearnSplit(key, callerRows / static_cast<double>(total));
}

}  // namespace kiln
