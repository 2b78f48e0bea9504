// In-order stream (see stream.h). Protocol:
//  - the JS thread pushes jobs under `mu_` and notifies only when the stream thread is asleep;
//  - the stream thread pops, runs, counts `completed_`; when the queue drains it wakes blocking
//    waiters (`drained_`) and, if a Promise is waiting, pings the JS thread through an unref'd
//    threadsafe function (ref'd only while a Promise is pending, so an idle stream never keeps the
//    event loop alive);
//  - after draining it spins briefly (a host dispatching back-to-back small kernels refills the queue
//    within microseconds; waking a sleeping thread costs far more), then sleeps on a condition variable.
//    The spin yields the CPU on each turn instead of pausing: with the pool's worker busy as well, this VM's two
//    vCPUs carry three threads, and a stream thread pausing on the vCPU the JS thread wanted kept the JS thread
//    off it. Measured in the engine loop (SmolLM-135M Q8_0, one stream, 2 threads): the JS side's launch of a
//    step took 93-196 us with pause and 21-43 us with yield, and the device's idle time between one step's
//    result reaching JS and the next step's launch fell from 163-308 to 86-124 us per token.
//  - an env cleanup hook (Worker exit, main-thread teardown) drops queued jobs, lets the running one
//    finish and joins the thread before the environment's ArrayBuffers go away.
// Step graphs: streamBeginCapture drains the stream, then submissions append to `EnvStream::capture`
// (nothing runs, no sequence numbers are taken) until streamEndCapture moves the list into a type-tagged
// External. streamLaunchGraph enqueues one job holding a shared_ptr to that list, so releasing the handle
// while a replay is queued is safe; the JS side keeps the ArrayBuffers the jobs point into alive.
#include "stream.h"

#include "thread-pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace kiln {
namespace {

constexpr int kSpinMicros = 50;

class Stream {
 public:
  explicit Stream(std::function<void()> onDrained) : onDrained_(std::move(onDrained)), thread_([this] { loop(); }) {}

  ~Stream() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      quit_ = true;
      queue_.clear();
    }
    cv_.notify_all();
    drained_.notify_all();
    thread_.join();
  }

  uint64_t submit(Job&& job) {
    bool wake;
    uint64_t seq;
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(std::move(job));
      seq = submitted_.fetch_add(1, std::memory_order_release) + 1;
      wake = sleeping_;
    }
    if (wake) cv_.notify_one();
    return seq;
  }

  void sync() {
    std::unique_lock<std::mutex> lk(mu_);
    drained_.wait(lk, [&] { return quit_ || completed_.load() == submitted_.load(); });
  }

  /** Blocks until jobs 1..target have run (the jobs enqueued after them may still be queued or running). */
  void syncTo(uint64_t target) {
    std::unique_lock<std::mutex> lk(mu_);
    waitTarget_ = target;
    drained_.wait(lk, [&] { return quit_ || completed_.load() >= target; });
    waitTarget_ = UINT64_MAX;
  }

  uint64_t submitted() const { return submitted_.load(std::memory_order_acquire); }
  uint64_t completed() const { return completed_.load(std::memory_order_acquire); }

  /** Moves the first recorded kernel error into *out; false when there is none. */
  bool takeError(std::string* out) {
    std::lock_guard<std::mutex> lk(mu_);
    if (error_.empty()) return false;
    *out = std::move(error_);
    error_.clear();
    return true;
  }

  /** Registers a Promise waiter for everything submitted so far; false (no waiter) when already drained. */
  bool addAsyncWaiter(uint64_t* target) {
    std::lock_guard<std::mutex> lk(mu_);
    if (completed_.load() == submitted_.load()) return false;
    *target = submitted_.load();
    ++asyncWaiters_;
    return true;
  }
  void removeAsyncWaiters(int n) {
    std::lock_guard<std::mutex> lk(mu_);
    asyncWaiters_ -= n;
  }

 private:
  void loop() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        if (queue_.empty() && !quit_) {
          lk.unlock();
          const auto t0 = std::chrono::steady_clock::now();
          for (int i = 0; submitted_.load(std::memory_order_acquire) == completed_.load(std::memory_order_relaxed); ++i) {
            std::this_thread::yield();
            if ((i & 7) == 7 && std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(kSpinMicros)) break;
          }
          lk.lock();
        }
        while (queue_.empty() && !quit_) {
          sleeping_ = true;
          cv_.wait(lk);
          sleeping_ = false;
        }
        if (quit_) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        job.run();
      } catch (const std::exception& e) {
        record(job.op, e.what());
      } catch (...) {
        record(job.op, "unknown native error");
      }
      job.run = nullptr;  // release captures before signalling completion
      bool notify;
      {
        std::lock_guard<std::mutex> lk(mu_);
        const uint64_t done = completed_.fetch_add(1, std::memory_order_release) + 1;
        const bool empty = done == submitted_.load();
        if (empty || done >= waitTarget_) drained_.notify_all();
        notify = empty && asyncWaiters_ > 0;
      }
      if (notify) onDrained_();
    }
  }

  void record(const char* op, const std::string& msg) {
    std::lock_guard<std::mutex> lk(mu_);
    if (error_.empty()) error_ = "[" + std::string(op) + "] " + msg + " (on the cpu stream)";
  }

  std::function<void()> onDrained_;
  std::mutex mu_;
  std::condition_variable cv_;       // stream thread sleeps here
  std::condition_variable drained_;  // blocking sync() waits here
  std::deque<Job> queue_;
  std::atomic<uint64_t> submitted_{0};
  std::atomic<uint64_t> completed_{0};
  uint64_t waitTarget_ = UINT64_MAX;  // syncTo's target (the JS thread is the one waiter), guarded by mu_
  bool sleeping_ = false;
  bool quit_ = false;
  int asyncWaiters_ = 0;
  std::string error_;
  std::thread thread_;  // last: starts after every other member is constructed
};

// ---------------------------------------------------------------- per-environment state
struct Waiter {
  napi_deferred deferred;
  uint64_t target;
};

struct EnvStream {
  napi_env env = nullptr;
  napi_threadsafe_function tsfn = nullptr;
  bool tsfnRefd = false;
  std::vector<Waiter> waiters;  // JS thread only
  Stream* stream = nullptr;
  std::shared_ptr<std::vector<Job>> capture;  // non-null while capturing (JS thread only)
};

using JobList = std::vector<Job>;

/** What a step-graph External holds; `jobs` is null once released. */
struct GraphHandle {
  std::shared_ptr<const JobList> jobs;
};

const napi_type_tag kGraphTag = {0x6b696c6e53746570ULL, 0x4772617068763031ULL};  // "kilnStep" "Graphv01"

EnvStream* lookup(napi_env env) {
  void* data = nullptr;
  if (napi_get_instance_data(env, &data) != napi_ok) return nullptr;
  return static_cast<EnvStream*>(data);
}

napi_value errorValue(napi_env env, const std::string& msg) {
  return Napi::Error::New(env, msg).Value();
}

// JS thread: settles every Promise whose target has completed (rejecting them with a recorded error).
void settle(EnvStream* es) {
  if (es->waiters.empty()) return;
  const uint64_t done = es->stream->completed();
  std::string err;
  bool failed = false;
  int settled = 0;
  std::vector<Waiter> keep;
  for (const Waiter& w : es->waiters) {
    if (w.target > done) {
      keep.push_back(w);
      continue;
    }
    if (settled == 0) failed = es->stream->takeError(&err);
    ++settled;
    if (failed) napi_reject_deferred(es->env, w.deferred, errorValue(es->env, err));
    else {
      napi_value undef;
      napi_get_undefined(es->env, &undef);
      napi_resolve_deferred(es->env, w.deferred, undef);
    }
  }
  es->waiters.swap(keep);
  if (settled) es->stream->removeAsyncWaiters(settled);
  if (es->waiters.empty() && es->tsfnRefd) {
    napi_unref_threadsafe_function(es->env, es->tsfn);
    es->tsfnRefd = false;
  }
}

void callJs(napi_env env, napi_value /*cb*/, void* context, void* /*data*/) {
  if (env == nullptr) return;  // environment tearing down
  Napi::HandleScope scope(env);
  settle(static_cast<EnvStream*>(context));
}

void cleanup(void* arg) {
  auto* es = static_cast<EnvStream*>(arg);
  delete es->stream;  // joins: no kernel touches this environment's memory afterwards
  es->stream = nullptr;
  napi_set_instance_data(es->env, nullptr, nullptr, nullptr);
  // the threadsafe function is finalized by Node's own cleanup of this environment
  delete es;
}

// Created on first use; the tsfn exists before the cleanup hook is added so that hook runs first (LIFO).
EnvStream* ensure(napi_env env) {
  if (EnvStream* es = lookup(env)) return es;
  auto* es = new EnvStream();
  es->env = env;
  napi_value name;
  napi_create_string_utf8(env, "kiln.cpuStream", NAPI_AUTO_LENGTH, &name);
  if (napi_create_threadsafe_function(env, nullptr, nullptr, name, 0, 1, nullptr, nullptr, es, callJs, &es->tsfn) !=
      napi_ok) {
    delete es;
    throw Napi::Error::New(env, "[stream] could not create the completion callback");
  }
  napi_unref_threadsafe_function(env, es->tsfn);
  napi_threadsafe_function tsfn = es->tsfn;
  es->stream = new Stream([tsfn] { napi_call_threadsafe_function(tsfn, nullptr, napi_tsfn_nonblocking); });
  napi_add_env_cleanup_hook(env, cleanup, es);
  napi_set_instance_data(env, es, nullptr, nullptr);
  return es;
}

// Moves this stream's cleanup hook to the front of its environment's teardown (hooks run last-added first): a Worker
// terminated mid-step must join the stream thread before the rest of the teardown frees memory a queued job reads.
void cleanupFirst(EnvStream* es) {
  napi_remove_env_cleanup_hook(es->env, cleanup, es);
  napi_add_env_cleanup_hook(es->env, cleanup, es);
}

void throwIfFailed(Napi::Env env, EnvStream* es) {
  std::string err;
  if (es->stream->takeError(&err)) throw Napi::Error::New(env, err);
}

[[noreturn]] void throwCapturing(Napi::Env env, const char* what) {
  throw Napi::Error::New(env, std::string("[stream] ") + what + " while a step graph is being captured");
}

Napi::Value StreamSync(const Napi::CallbackInfo& info) {
  EnvStream* es = lookup(info.Env());
  if (!es) return info.Env().Undefined();
  if (es->capture) throwCapturing(info.Env(), "streamSync");
  es->stream->sync();
  throwIfFailed(info.Env(), es);
  settle(es);
  return info.Env().Undefined();
}

// streamWaitFor(seq): blocks until the jobs up to sequence number `seq` have run (later ones may still run);
// rethrows a recorded kernel error.
Napi::Value StreamWaitFor(const Napi::CallbackInfo& info) {
  EnvStream* es = lookup(info.Env());
  if (!es) return info.Env().Undefined();
  if (es->capture) throwCapturing(info.Env(), "streamWaitFor");
  if (info.Length() < 1 || !info[0].IsNumber()) throw Napi::TypeError::New(info.Env(), "[streamWaitFor] expected a sequence number");
  const double seq = info[0].As<Napi::Number>().DoubleValue();
  if (!(seq >= 0) || seq > static_cast<double>(es->stream->submitted()))
    throw Napi::RangeError::New(info.Env(), "[streamWaitFor] sequence number " + std::to_string(seq) + " was never submitted");
  es->stream->syncTo(static_cast<uint64_t>(seq));
  throwIfFailed(info.Env(), es);
  settle(es);
  return info.Env().Undefined();
}

Napi::Value StreamSyncAsync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  napi_deferred deferred;
  napi_value promise;
  napi_create_promise(env, &deferred, &promise);
  EnvStream* es = lookup(env);
  if (es && es->capture) throwCapturing(env, "streamSyncAsync");
  uint64_t target = 0;
  if (!es || !es->stream->addAsyncWaiter(&target)) {  // already drained: settle now
    std::string err;
    if (es && es->stream->takeError(&err)) napi_reject_deferred(env, deferred, errorValue(env, err));
    else napi_resolve_deferred(env, deferred, env.Undefined());
    return Napi::Value(env, promise);
  }
  es->waiters.push_back({deferred, target});
  if (!es->tsfnRefd) {  // keep the loop alive only while someone awaits
    napi_ref_threadsafe_function(env, es->tsfn);
    es->tsfnRefd = true;
  }
  return Napi::Value(env, promise);
}

Napi::Value StreamPending(const Napi::CallbackInfo& info) {
  EnvStream* es = lookup(info.Env());
  const double n = es ? static_cast<double>(es->stream->submitted() - es->stream->completed()) : 0.0;
  return Napi::Number::New(info.Env(), n);
}

Napi::Value StreamSubmitted(const Napi::CallbackInfo& info) {
  EnvStream* es = lookup(info.Env());
  return Napi::Number::New(info.Env(), es ? static_cast<double>(es->stream->submitted()) : 0.0);
}

Napi::Value StreamCompleted(const Napi::CallbackInfo& info) {
  EnvStream* es = lookup(info.Env());
  return Napi::Number::New(info.Env(), es ? static_cast<double>(es->stream->completed()) : 0.0);
}

// ---------------------------------------------------------------- step graphs
// streamBeginCapture(): drains the stream (rethrowing a recorded error), then records submissions.
Napi::Value StreamBeginCapture(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  EnvStream* es = ensure(env);
  if (es->capture) throwCapturing(env, "streamBeginCapture");
  es->stream->sync();
  throwIfFailed(env, es);
  settle(es);
  es->capture = std::make_shared<JobList>();
  return env.Undefined();
}

// streamEndCapture() -> handle: the recorded jobs, in order; capture mode ends.
Napi::Value StreamEndCapture(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  EnvStream* es = lookup(env);
  if (!es || !es->capture) throw Napi::Error::New(env, "[stream] streamEndCapture without streamBeginCapture");
  mergeCapturedJobs(*es->capture);
  auto* handle = new GraphHandle{std::move(es->capture)};
  es->capture.reset();
  auto ext = Napi::External<GraphHandle>::New(env, handle, [](Napi::Env, GraphHandle* h) { delete h; });
  ext.TypeTag(&kGraphTag);
  return ext;
}

Napi::Value StreamCapturing(const Napi::CallbackInfo& info) {
  EnvStream* es = lookup(info.Env());
  return Napi::Boolean::New(info.Env(), es != nullptr && es->capture != nullptr);
}

GraphHandle* graphArg(const Napi::CallbackInfo& info, const char* fn) {
  if (info.Length() < 1 || !info[0].IsExternal() || !info[0].As<Napi::External<GraphHandle>>().CheckTypeTag(&kGraphTag))
    throw Napi::TypeError::New(info.Env(), std::string("[") + fn + "] expected a step-graph handle from streamEndCapture");
  return info[0].As<Napi::External<GraphHandle>>().Data();
}

// One recorded job of a replay: its prefetch hint and side lines (mergeCapturedJobs) around the kernel.
void runGraphJob(const Job& j) {
  if (j.prefetchBytes > 0) poolPrefetchHint(j.prefetch, j.prefetchBytes);
  if (j.warm) j.warm();
  j.run();
  if (j.warm) sideLines()->clear();
}

// streamLaunchGraph(handle) -> sequence number: ONE stream job that runs every recorded job in order and
// stops at the first failure (recorded like any kernel error, rethrown at the next sync).
Napi::Value StreamLaunchGraph(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  GraphHandle* h = graphArg(info, "streamLaunchGraph");
  if (!h->jobs) throw Napi::Error::New(env, "[streamLaunchGraph] the step graph was released");
  EnvStream* es = ensure(env);
  if (es->capture) throwCapturing(env, "streamLaunchGraph");
  if (h->jobs->empty()) return Napi::Number::New(env, static_cast<double>(es->stream->submitted()));
  std::shared_ptr<const JobList> jobs = h->jobs;
  cleanupFirst(es);
  Job replay{"stepGraph", [jobs] {
               for (const Job& j : *jobs) {
                 try {
                   runGraphJob(j);
                 } catch (const std::exception& e) {
                   throw std::runtime_error(std::string("[") + j.op + "] " + e.what());
                 }
               }
             }};
  return Napi::Number::New(env, static_cast<double>(es->stream->submit(std::move(replay))));
}

// streamProfileGraph(handle, reps) -> { ops: string[], ns: Float64Array, medianNs: Float64Array }: drains the stream,
// then replays the graph `reps` times on the calling thread timing every job; ns[i] is job i's best time over the
// reps, medianNs[i] its median (a profiling aid for bench/step-profile: the sum of bests undercounts a step, whose
// kernels are not all at their best in one replay).
Napi::Value StreamProfileGraph(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  GraphHandle* h = graphArg(info, "streamProfileGraph");
  if (!h->jobs) throw Napi::Error::New(env, "[streamProfileGraph] the step graph was released");
  const int reps = info.Length() > 1 && info[1].IsNumber() ? std::max(1, info[1].As<Napi::Number>().Int32Value()) : 1;
  EnvStream* es = ensure(env);
  if (es->capture) throwCapturing(env, "streamProfileGraph");
  es->stream->sync();
  throwIfFailed(env, es);
  const JobList& jobs = *h->jobs;
  std::vector<std::vector<double>> times(jobs.size(), std::vector<double>(static_cast<size_t>(reps)));
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < jobs.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      runGraphJob(jobs[i]);
      times[i][static_cast<size_t>(r)] = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    }
  Napi::Array ops = Napi::Array::New(env, jobs.size());
  Napi::Float64Array ns = Napi::Float64Array::New(env, jobs.size());
  Napi::Float64Array medianNs = Napi::Float64Array::New(env, jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    ops.Set(static_cast<uint32_t>(i), Napi::String::New(env, jobs[i].op));
    std::sort(times[i].begin(), times[i].end());
    ns[i] = times[i].front();
    medianNs[i] = times[i][times[i].size() / 2];
  }
  Napi::Object out = Napi::Object::New(env);
  out.Set("ops", ops);
  out.Set("ns", ns);
  out.Set("medianNs", medianNs);
  return out;
}

Napi::Value StreamGraphKernels(const Napi::CallbackInfo& info) {
  GraphHandle* h = graphArg(info, "streamGraphKernels");
  return Napi::Number::New(info.Env(), h->jobs ? static_cast<double>(h->jobs->size()) : 0.0);
}

// streamReleaseGraph(handle): drops the jobs now (a queued replay keeps its own reference until it has run).
Napi::Value StreamReleaseGraph(const Napi::CallbackInfo& info) {
  graphArg(info, "streamReleaseGraph")->jobs.reset();
  return info.Env().Undefined();
}

}  // namespace

void streamDrainForSyncCall(Napi::Env env) {
  EnvStream* es = lookup(env);
  if (!es) return;
  if (es->capture) throwCapturing(env, "a synchronous native call");
  if (es->stream->submitted() != es->stream->completed()) es->stream->sync();
  throwIfFailed(env, es);
}

void streamWaitIdle(napi_env env) {
  EnvStream* es = lookup(env);
  if (es && es->stream && es->stream->submitted() != es->stream->completed()) es->stream->sync();
}

Napi::Value streamSubmit(Napi::Env env, Job job) {
  EnvStream* es = ensure(env);
  if (!job.run) return Napi::Number::New(env, static_cast<double>(es->stream->submitted()));
  if (es->capture) {
    es->capture->push_back(std::move(job));
    return Napi::Number::New(env, static_cast<double>(es->stream->submitted()));
  }
  cleanupFirst(es);
  return Napi::Number::New(env, static_cast<double>(es->stream->submit(std::move(job))));
}

void addStreamExports(Napi::Env env, Napi::Object exports) {
  exports.Set("streamSync", Napi::Function::New(env, StreamSync, "streamSync"));
  exports.Set("streamSyncAsync", Napi::Function::New(env, StreamSyncAsync, "streamSyncAsync"));
  exports.Set("streamPending", Napi::Function::New(env, StreamPending, "streamPending"));
  exports.Set("streamCompleted", Napi::Function::New(env, StreamCompleted, "streamCompleted"));
  exports.Set("streamSubmitted", Napi::Function::New(env, StreamSubmitted, "streamSubmitted"));
  exports.Set("streamWaitFor", Napi::Function::New(env, StreamWaitFor, "streamWaitFor"));
  exports.Set("streamBeginCapture", Napi::Function::New(env, StreamBeginCapture, "streamBeginCapture"));
  exports.Set("streamEndCapture", Napi::Function::New(env, StreamEndCapture, "streamEndCapture"));
  exports.Set("streamCapturing", Napi::Function::New(env, StreamCapturing, "streamCapturing"));
  exports.Set("streamLaunchGraph", Napi::Function::New(env, StreamLaunchGraph, "streamLaunchGraph"));
  exports.Set("streamGraphKernels", Napi::Function::New(env, StreamGraphKernels, "streamGraphKernels"));
  exports.Set("streamProfileGraph", Napi::Function::New(env, StreamProfileGraph, "streamProfileGraph"));
  exports.Set("streamReleaseGraph", Napi::Function::New(env, StreamReleaseGraph, "streamReleaseGraph"));
}

}  // namespace kiln
