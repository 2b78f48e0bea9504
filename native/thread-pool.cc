// Spin-then-sleep worker pool (see thread-pool.h). Protocol:
//  - `gen_` is a sequence: odd while the caller writes a job, even when published.
//  - a worker that sees a new even generation increments `inflight_`, re-checks `gen_`, then
//    claims chunks; the caller waits for inflight_ == 0 before rewriting job fields, so a
//    worker never reads a half-written job. Chunks are claimed with fetch_add on `next_`.
//  - idle workers spin ~kSpinMicros then sleep on a condition variable; the caller only
//    takes the mutex to notify when some worker is asleep.
//  - a spinning worker takes a published prefetch hint (`hint_`, exchanged to null) and prefetches it 1 KiB at a
//    time, stopping at the next job; publishing a job drops a hint nobody took.
//  - a job of two chunks on a pool of one worker takes a shorter path instead (runPair: `pairSeq_`, one claim
//    word, one done word).
#include "thread-pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace kiln {
namespace {

constexpr int kSpinMicros = 150;
constexpr double kSplitStep = 0.3;  // damping of runRows' cut updates
constexpr double kSplitMin = 0.1;   // neither share drops below this fraction of the rows
using Clock = std::chrono::steady_clock;

// runRows' learned cuts: the caller's fraction of the rows per key, in a fixed open-addressed table (a full table
// leaves new keys at an even cut), behind its own mutex (callers on several threads may split rows at once).
// Keys are never evicted: a freed weight's address reused by another weight hands it the old cut, which its own
// runs then correct within a few steps.
struct Split {
  const void* key = nullptr;
  double fraction = 0.5;
};
class SplitTable {
 public:
  Split* find(const void* key) {
    if (!key) return nullptr;
    size_t h = (reinterpret_cast<uintptr_t>(key) >> 6) * 0x9E3779B97F4A7C15ull >> 52;  // 12 bits
    for (size_t probe = 0; probe < kSize; ++probe, h = (h + 1) & (kSize - 1)) {
      Split& e = slots_[h];
      if (e.key == key) return &e;
      if (!e.key) {
        if (used_ * 4 >= kSize * 3) return nullptr;
        ++used_;
        e.key = key;
        return &e;
      }
    }
    return nullptr;
  }

 private:
  static constexpr size_t kSize = 4096;
  Split slots_[kSize];
  size_t used_ = 0;
};

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

class Pool {
 public:
  Pool() { start(defaultThreads()); }
  ~Pool() { stop(); }

  static int defaultThreads() {
    unsigned hc = std::thread::hardware_concurrency();
    return hc == 0 ? 1 : static_cast<int>(hc);
  }

  int numThreads() const { return static_cast<int>(workers_.size()) + 1; }

  void prefetchHint(const void* p, int64_t bytes) {
    if (workers_.empty() || bytes <= 0) return;
    Hint& h = hints_[hintNext_++ & 3];
    h = {static_cast<const char*>(p), bytes};
    hint_.store(&h, std::memory_order_release);
  }

  void setNumThreads(int n) {
    if (n < 1) n = 1;
    std::lock_guard<std::mutex> g(runMutex_);
    if (n == numThreads()) return;
    stop();
    start(n);
  }

  void runRows(const void* key, int64_t total, int64_t minShare, RangeFn fn, void* ctx) {
    if (minShare < 1) minShare = 1;
    const int threads = numThreads();
    int64_t share = (total + threads - 1) / threads;
    if (share < minShare) share = minShare;
    if (share >= total) {  // one share: run it here, waking no worker
      fn(ctx, 0, total);
      return;
    }
    if (threads != 2 || total < 2 * minShare) {
      struct Even {
        RangeFn fn;
        void* ctx;
        int64_t share, total;
      } even{fn, ctx, share, total};
      run((total + share - 1) / share, [](void* c, int64_t i) {
        const Even& e = *static_cast<Even*>(c);
        e.fn(e.ctx, i * e.share, (i + 1) * e.share < e.total ? (i + 1) * e.share : e.total);
      }, &even, 0);
      return;
    }
    const double f = splitFraction(key);
    int64_t cut = static_cast<int64_t>(static_cast<double>(total) * f + 0.5);
    if (cut < minShare) cut = minShare;
    if (cut > total - minShare) cut = total - minShare;
    struct Timed {
      RangeFn fn;
      void* ctx;
      int64_t cut, total;
      std::thread::id caller;
      Clock::time_point start[2], end[2];
      bool onCaller[2];
    } t{fn, ctx, cut, total, std::this_thread::get_id(), {}, {}, {false, false}};
    run(2, [](void* c, int64_t i) {
      Timed& x = *static_cast<Timed*>(c);
      x.start[i] = Clock::now();
      x.fn(x.ctx, i == 0 ? 0 : x.cut, i == 0 ? x.cut : x.total);
      x.end[i] = Clock::now();
      x.onCaller[i] = std::this_thread::get_id() == x.caller;
    }, &t, 0);
    // Learn only from runs where the caller took share 0 and the worker share 1 (nearly all: the caller claims
    // first). Each share's time is modelled as its start plus its rows times a per-row cost; the cut that would
    // have ended both at once is approached by a damped step (one run's timing is noisy).
    if (!t.onCaller[0] || t.onCaller[1]) return;
    const double fc = static_cast<double>(cut) / static_cast<double>(total), fw = 1 - fc;
    const auto ns = [&](Clock::time_point a) { return std::chrono::duration<double, std::nano>(a - t.start[0]).count(); };
    const double startW = ns(t.start[1]);
    const double perC = ns(t.end[0]) / fc, perW = (ns(t.end[1]) - startW) / fw;  // whole-job time at each rate
    if (!(perC > 0 && perW > 0)) return;
    learnSplit(key, (startW + perW) / (perC + perW));
  }

  double splitFraction(const void* key) {
    std::lock_guard<std::mutex> g(splitMutex_);
    Split* s = splits_.find(key);
    return s ? s->fraction : 0.5;
  }
  // Moves key's cut a damped step toward `target` (the caller's fraction that fits what a run measured).
  void learnSplit(const void* key, double target) {
    std::lock_guard<std::mutex> g(splitMutex_);
    Split* s = splits_.find(key);
    if (!s) return;
    double next = s->fraction + kSplitStep * (target - s->fraction);
    if (next < kSplitMin) next = kSplitMin;
    if (next > 1 - kSplitMin) next = 1 - kSplitMin;
    s->fraction = next;
  }

  void run(int64_t numChunks, ChunkFn fn, void* ctx, int maxThreads) {
    // Concurrent callers (e.g. worker_threads) or a busy pool: run inline.
    std::unique_lock<std::mutex> lk(runMutex_, std::try_to_lock);
    if (!lk.owns_lock() || workers_.empty() || maxThreads == 1) {
      for (int64_t c = 0; c < numChunks; ++c) fn(ctx, c);
      return;
    }
    if (numChunks == 2 && workers_.size() == 1) return runPair(fn, ctx);
    int helpers = static_cast<int>(workers_.size());
    if (maxThreads > 0 && maxThreads - 1 < helpers) helpers = maxThreads - 1;
    if (helpers > numChunks - 1) helpers = static_cast<int>(numChunks - 1);

    uint64_t g = gen_.load(std::memory_order_relaxed);
    gen_.store(g + 1, std::memory_order_seq_cst);  // odd: writing
    while (inflight_.load(std::memory_order_seq_cst) != 0) cpuRelax();
    fn_ = fn;
    ctx_ = ctx;
    numChunks_ = numChunks;
    maxHelpers_ = helpers;
    helperSlots_.store(0, std::memory_order_relaxed);
    next_.store(0, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    hint_.store(nullptr, std::memory_order_relaxed);  // a hint not taken up by now is for this job: too late
    gen_.store(g + 2, std::memory_order_seq_cst);  // even: published
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> sg(sleepMutex_);
      sleepCv_.notify_all();
    }
    int64_t mine = 0;
    for (;;) {
      int64_t c = next_.fetch_add(1, std::memory_order_relaxed);
      if (c >= numChunks) break;
      fn(ctx, c);
      ++mine;
    }
    done_.fetch_add(mine, std::memory_order_acq_rel);
    // A worker still holds a chunk. If it was descheduled (oversubscribed machine), yield
    // the core to it instead of spinning for a whole scheduler quantum.
    for (int iter = 0; done_.load(std::memory_order_acquire) < numChunks; ++iter) {
      if (iter < 20000) cpuRelax();
      else std::this_thread::yield();
    }
  }

 private:
  // A two-chunk job with one worker (every decode GEMV of a 2-thread pool) through three words instead of the general
  // protocol's gen_ / inflight_ / helperSlots_ / next_ / done_ round trips between the cores: the caller publishes
  // the job under a sequence number, runs chunk 0, then races the worker for chunk 1 on one claim word (2 * seq, + 1
  // once claimed); the worker that wins reads the job and raises pairDone_ to seq when done. The caller rewrites the
  // job only after seq has completed, and a worker that comes late for an old seq loses the claim (the word has moved
  // on) and never reads the job. SmolLM-shaped decode chains (bench:chain, alternating runs): Q8_0 2.74 vs 2.77 ms
  // (8 runs of 3 rounds), bf16 6.66 vs 6.77 ms (4 runs of 2 rounds); a lab loop over the same bytes cut into 16 and 1024 runRows jobs:
  // 0.99-1.03 us per job against 1.12-1.16 us (a bare two-thread loop without runRows' cut learning: 0.65-0.74).
  void runPair(ChunkFn fn, void* ctx) {
    const uint64_t seq = pairSeq_.load(std::memory_order_relaxed) + 1;
    pairFn_ = fn, pairCtx_ = ctx;
    pairClaim_.store(2 * seq, std::memory_order_relaxed);
    hint_.store(nullptr, std::memory_order_relaxed);  // a hint not taken up by now is for this job: too late
    pairSeq_.store(seq, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> sg(sleepMutex_);
      sleepCv_.notify_all();
    }
    fn(ctx, 0);
    uint64_t unclaimed = 2 * seq;
    if (pairClaim_.compare_exchange_strong(unclaimed, 2 * seq + 1, std::memory_order_acq_rel)) {
      fn(ctx, 1);  // the worker has not started it: run it here
      return;
    }
    for (int iter = 0; pairDone_.load(std::memory_order_acquire) != seq; ++iter) {
      if (iter < 20000) cpuRelax();
      else std::this_thread::yield();
    }
  }
  // The worker's side: claims and runs chunk 1 of pair job `seq`, unless the caller took it.
  void workPair(uint64_t seq) {
    pairSeen_ = seq;
    uint64_t unclaimed = 2 * seq;
    if (!pairClaim_.compare_exchange_strong(unclaimed, 2 * seq + 1, std::memory_order_acq_rel)) return;
    pairFn_(pairCtx_, 1);
    pairDone_.store(seq, std::memory_order_release);
  }

  void start(int n) {
    quit_.store(false);
    pairSeen_ = pairSeq_.load(std::memory_order_relaxed);
    for (int i = 1; i < n; ++i) workers_.emplace_back([this] { workerLoop(); });
  }

  void stop() {
    quit_.store(true, std::memory_order_seq_cst);
    {
      std::lock_guard<std::mutex> sg(sleepMutex_);
      sleepCv_.notify_all();
    }
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  void workerLoop() {
    uint64_t seen = gen_.load(std::memory_order_acquire) & ~uint64_t(1);
    for (;;) {
      uint64_t g = waitForJob(seen);
      if (g == 0) return;  // quit
      inflight_.fetch_add(1, std::memory_order_seq_cst);
      if (gen_.load(std::memory_order_seq_cst) != g) {
        inflight_.fetch_sub(1, std::memory_order_seq_cst);
        continue;  // job being rewritten; look again
      }
      seen = g;
      // Cap the number of helpers (e.g. a job asked for fewer threads).
      if (helperSlots_.fetch_add(1, std::memory_order_relaxed) < maxHelpers_) {
        int64_t mine = 0;
        const int64_t n = numChunks_;
        for (;;) {
          int64_t c = next_.fetch_add(1, std::memory_order_relaxed);
          if (c >= n) break;
          fn_(ctx_, c);
          ++mine;
        }
        if (mine) done_.fetch_add(mine, std::memory_order_acq_rel);
      }
      inflight_.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

  // Returns the new even generation to work on, or 0 on quit.
  uint64_t waitForJob(uint64_t seen) {
    auto ready = [&](uint64_t g) { return g != seen && (g & 1) == 0; };
  spin:
    auto t0 = std::chrono::steady_clock::now();
    for (int iter = 0;; ++iter) {
      if (quit_.load(std::memory_order_relaxed)) return 0;
      if (const uint64_t ps = pairSeq_.load(std::memory_order_acquire); ps != pairSeen_) {
        workPair(ps);
        t0 = std::chrono::steady_clock::now();
        continue;
      }
      uint64_t g = gen_.load(std::memory_order_acquire);
      if (ready(g)) return g;
      if (hint_.load(std::memory_order_relaxed) != nullptr) {
        if (const Hint* taken = hint_.exchange(nullptr, std::memory_order_acquire)) {
          const Hint h = *taken;  // the caller rewrites the slot 4 hints later: read it once
          for (int64_t off = 0; off < h.bytes; off += 1024) {
            if (ready(gen_.load(std::memory_order_acquire)) || pairSeq_.load(std::memory_order_acquire) != pairSeen_ ||
                quit_.load(std::memory_order_relaxed))
              break;
            const int64_t end = off + 1024 < h.bytes ? off + 1024 : h.bytes;
            for (int64_t l = off; l < end; l += 64) __builtin_prefetch(h.p + l, 0, 2);
          }
          t0 = std::chrono::steady_clock::now();
          continue;
        }
      }
      cpuRelax();
      if ((iter & 63) == 63 &&
          std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(kSpinMicros))
        break;
    }
    std::unique_lock<std::mutex> lk(sleepMutex_);
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    for (;;) {
      if (quit_.load(std::memory_order_seq_cst)) {
        sleepers_.fetch_sub(1);
        return 0;
      }
      uint64_t g = gen_.load(std::memory_order_seq_cst);
      if (ready(g)) {
        sleepers_.fetch_sub(1);
        return g;
      }
      if (pairSeq_.load(std::memory_order_seq_cst) != pairSeen_) {  // a pair job: back to the spin loop, which runs it
        sleepers_.fetch_sub(1);
        lk.unlock();
        goto spin;
      }
      if (g & 1) {  // caller is mid-publish: spin briefly outside the lock
        lk.unlock();
        cpuRelax();
        lk.lock();
        continue;
      }
      sleepCv_.wait(lk);
    }
  }

  struct Hint {
    const char* p;
    int64_t bytes;
  };
  Hint hints_[4] = {};  // written by the caller, published through hint_ (a slot is reused 4 hints later)
  int hintNext_ = 0;
  alignas(64) std::atomic<const Hint*> hint_{nullptr};
  std::vector<std::thread> workers_;
  SplitTable splits_;
  std::mutex splitMutex_;
  std::mutex runMutex_;
  std::mutex sleepMutex_;
  std::condition_variable sleepCv_;
  alignas(64) std::atomic<uint64_t> pairSeq_{0};  // runPair's job: its sequence number and fields on one line
  ChunkFn pairFn_ = nullptr;
  void* pairCtx_ = nullptr;
  alignas(64) std::atomic<uint64_t> pairClaim_{0};
  alignas(64) std::atomic<uint64_t> pairDone_{0};
  uint64_t pairSeen_ = 0;  // the worker's: the last pair job it looked at
  alignas(64) std::atomic<uint64_t> gen_{0};
  alignas(64) std::atomic<int> inflight_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> quit_{false};
  alignas(64) std::atomic<int64_t> next_{0};
  alignas(64) std::atomic<int64_t> done_{0};
  std::atomic<int> helperSlots_{0};
  ChunkFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t numChunks_ = 0;
  int maxHelpers_ = 0;
};

Pool& pool() {
  static Pool* p = new Pool();  // leaked on purpose: no join at process exit
  return *p;
}

// poolRunShares' state: per share a claim flag, and the request flag its owner polls between tiles.
//  req: 0 open, 1 asked (by the other thread), 2 granted (grant written), 3 closed (the owner is done).
//  Thief: CAS 0 -> 1, wait while 1, read the grant, store 0 (an empty grant: stop asking). Owner: on seeing 1, writes
//  its remaining units' second half as the grant (none when fewer than 2 * minGive remain), then stores 2; when
//  done, CAS 0 -> 3, answering (empty) a request it meets there and waiting out a grant not yet read.
struct alignas(64) ShareSlot {
  std::atomic<int> req{0};
  std::atomic<bool> claimed{false};
  int64_t grantLo = 0, grantHi = 0;
};
struct SharesJob {
  ShareSlot slot[2];
  const int64_t* units;
  int64_t minGive;
  ShareFn fn;
  void* ctx;
  std::thread::id caller;
  int64_t callerUnits[2] = {0, 0};
};

void runOwner(SharesJob& j, int s, bool onCaller) {
  ShareSlot& sl = j.slot[s];
  int64_t next = 0, end = j.units[s];
  while (next < end) {
    next += j.fn(j.ctx, s, next, end, &sl.req);
    if (sl.req.load(std::memory_order_acquire) == 1) {
      const int64_t left = end - next, give = left >= 2 * j.minGive ? left / 2 : 0;
      sl.grantLo = end - give, sl.grantHi = end;
      end -= give;
      sl.req.store(2, std::memory_order_release);
    }
  }
  if (onCaller) j.callerUnits[s] += end;  // units [0, end) ran here
  for (;;) {
    int r = 0;
    if (sl.req.compare_exchange_strong(r, 3, std::memory_order_acq_rel)) return;
    if (r == 1) {
      sl.grantLo = sl.grantHi = 0;
      sl.req.store(2, std::memory_order_release);
    }
    cpuRelax();
  }
}

// Takes halves of share s's remaining units from its owner until it is done or grants nothing.
void runThief(SharesJob& j, int s, bool onCaller) {
  ShareSlot& sl = j.slot[s];
  for (;;) {
    int r = 0;
    if (!sl.req.compare_exchange_strong(r, 1, std::memory_order_acq_rel)) return;  // closed
    while (sl.req.load(std::memory_order_acquire) == 1) cpuRelax();
    const int64_t lo = sl.grantLo, hi = sl.grantHi;
    sl.req.store(0, std::memory_order_release);
    if (lo >= hi) return;
    j.fn(j.ctx, s, lo, hi, nullptr);
    if (onCaller) j.callerUnits[s] += hi - lo;
  }
}

}  // namespace

void poolRunShares(const int64_t units[2], int64_t minGive, ShareFn fn, void* ctx, int64_t callerUnits[2]) {
  SharesJob j;
  j.units = units, j.minGive = minGive < 1 ? 1 : minGive, j.fn = fn, j.ctx = ctx, j.caller = std::this_thread::get_id();
  pool().run(2, [](void* c, int64_t chunk) {
    SharesJob& x = *static_cast<SharesJob*>(c);
    const bool onCaller = std::this_thread::get_id() == x.caller;
    const int first = static_cast<int>(chunk);
    for (int k = 0; k < 2; ++k) {
      const int s = k == 0 ? first : 1 - first;
      if (!x.slot[s].claimed.exchange(true, std::memory_order_acq_rel)) runOwner(x, s, onCaller);
      else runThief(x, s, onCaller);
    }
  }, &j, 0);
  callerUnits[0] = j.callerUnits[0], callerUnits[1] = j.callerUnits[1];
}
double poolSplitFraction(const void* key) { return pool().splitFraction(key); }
void poolLearnSplit(const void* key, double callerFraction) { pool().learnSplit(key, callerFraction); }

void poolRun(int64_t numChunks, ChunkFn fn, void* ctx, int maxThreads) {
  pool().run(numChunks, fn, ctx, maxThreads);
}
void poolRunRows(const void* key, int64_t total, int64_t minShare, RangeFn fn, void* ctx) {
  pool().runRows(key, total, minShare, fn, ctx);
}
namespace {
// thread-pool.h DecodeTuning, by the CPU.
DecodeTuning chooseDecodeTuning() {
  DecodeTuning t{1536, 1024, false, 0};
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  char vendor[13] = {};
  if (__get_cpuid(0, &a, &b, &c, &d)) memcpy(vendor, &b, 4), memcpy(vendor + 4, &d, 4), memcpy(vendor + 8, &c, 4);
  if (strcmp(vendor, "AuthenticAMD") == 0 && __get_cpuid(1, &a, &b, &c, &d)) {
    const unsigned family = ((a >> 8) & 0xf) + (((a >> 8) & 0xf) == 0xf ? (a >> 20) & 0xff : 0);
    if (family >= 0x1a) t = {2048, 1024, true, int64_t{4} << 20};
  }
#endif
  return t;
}
}  // namespace
DecodeTuning gDecodeTuning = chooseDecodeTuning();

void poolPrefetchHint(const void* p, int64_t bytes) { pool().prefetchHint(p, bytes); }
SideLines* sideLines() {
  static thread_local SideLines s;
  return &s;
}
void poolSetNumThreads(int n) { pool().setNumThreads(n); }
int poolGetNumThreads() { return pool().numThreads(); }

double poolRoundTripNs(int iterations) {
  if (pool().numThreads() < 2 || iterations < 1) return 0;
  struct alignas(64) Line {
    std::atomic<int64_t> v{0};
  } ball;
  std::atomic<bool> gaveUp{false};
  double result = -1;
  const int64_t rounds = int64_t{iterations} + 100;  // the first 100 round trips warm up, untimed
  // Waits for `want` in the ball; gives up (and makes the other side give up) after 100 ms without it: a pool busy
  // with another caller's job runs both chunks inline, one after the other, on this thread.
  auto await = [&](int64_t want) {
    const auto t0 = Clock::now();
    for (int spin = 0; ball.v.load(std::memory_order_acquire) != want; ++spin) {
      if (gaveUp.load(std::memory_order_relaxed)) return false;
      if ((spin & 1023) == 1023 && Clock::now() - t0 > std::chrono::milliseconds(100)) {
        gaveUp.store(true, std::memory_order_relaxed);
        return false;
      }
      cpuRelax();
    }
    return true;
  };
  auto body = [&](int64_t c) {
    if (c == 1) {  // answers each odd value with the next even one
      for (int64_t i = 0; i < rounds; ++i) {
        if (!await(2 * i + 1)) return;
        ball.v.store(2 * i + 2, std::memory_order_release);
      }
      return;
    }
    Clock::time_point t0;
    for (int64_t i = 0; i < rounds; ++i) {
      if (i == 100) t0 = Clock::now();
      ball.v.store(2 * i + 1, std::memory_order_release);
      if (!await(2 * i + 2)) return;
    }
    result = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / static_cast<double>(iterations);
  };
  // two chunks on two threads: whichever thread takes a chunk first stays in it until the other chunk answers
  parallelChunks(2, body, 2);
  return result;
}

}  // namespace kiln
