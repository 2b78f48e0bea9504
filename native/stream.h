// The cpu device's in-order stream: one dedicated native thread per JS environment (main thread or
// worker_threads Worker) popping kernel jobs from a FIFO. Arguments are validated on the JS thread when a
// job is made (so errors still throw at dispatch, naming the op); the stream thread only runs kernels,
// acting as the thread pool's caller. The JS side keeps every typed array of a pending job alive.
// Step graphs (CUDA-graph style): between streamBeginCapture and streamEndCapture every submitted job is
// recorded instead of run; streamLaunchGraph enqueues one job that replays them all in order. A Job must
// therefore be re-runnable: it captures raw pointers and sizes by value and never mutates its captures.
#pragma once
#include <napi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels.h"
#include "quant.h"

namespace kiln {

/**
 * A validated kernel launch: raw pointers and sizes captured by value. An empty `run` is a no-op. `run` may be
 * called more than once (step-graph replay), so it must not move, free or permute its captured state.
 */
struct Job {
  const char* op = "";
  std::function<void()> run;
  /** Set when the launch is one M = 1 product x @ W^T that a step graph may merge with its neighbours. */
  std::shared_ptr<const struct GemvLaunch> gemv;
  /** Step graphs: bytes idle pool workers prefetch while this job runs (poolPrefetchHint), set by mergeCapturedJobs. */
  const void* prefetch = nullptr;
  int64_t prefetchBytes = 0;
  /** Queues as side lines (thread-pool.h) what run() will read that earlier jobs do not bring in (paged attention: its
   * sequences' cached K/V). */
  std::function<void()> prefetchReads;
  /** Step graphs: the next job's prefetchReads, run by the stream thread before this GEMV job, whose tiles prefetch the
   * lines it queues (set by mergeCapturedJobs; the queue is cleared after the job). */
  std::function<void()> warm;
};

/**
 * A GEMV launch's arguments: the float/bf16 matmul's (gemvGroupable) or the quantized one's (quantGroupable).
 * Consecutive GEMVs of one x in a finished capture run as one job (mergeCapturedJobs), as vLLM merges q/k/v and
 * gate/up into one projection, but without copying the weights together.
 */
struct GemvLaunch {
  bool quant = false;
  MatmulArgs m{};
  QuantMatmulArgs q{};
};

/**
 * Defined by the addon (it owns the kernel tables): rewrites a finished capture's jobs in place, merging each run
 * of two or more consecutive GEMV launches that read the same x (same K, dtype or scheme) and are independent (no
 * launch's output overlaps another's output or anything another reads: x, weights, scales) into one group launch.
 * Outputs are those of the separate launches, bit for bit.
 */
void mergeCapturedJobs(std::vector<Job>& jobs);

/**
 * Drains the environment's stream (if it has one) before a synchronous kernel runs, so direct native
 * calls keep stream order; rethrows a recorded stream error as a JS exception. Throws during a capture.
 */
void streamDrainForSyncCall(Napi::Env env);
/**
 * Waits until env's stream has run every job queued so far (no-op without a stream); throws nothing. For finalizers
 * that free memory a queued job may read: a Worker terminated mid-step frees its buffers in its environment's
 * teardown, before the stream's own cleanup hook joins the stream thread.
 */
void streamWaitIdle(napi_env env);

/**
 * Enqueues the job on the environment's stream (created on first use); returns its sequence number. While
 * capturing, appends it to the capture instead (returns the last sequence number; nothing runs).
 */
Napi::Value streamSubmit(Napi::Env env, Job job);

/**
 * Adds streamSync, streamSyncAsync, streamWaitFor, streamPending, streamSubmitted, streamCompleted and the step-graph calls
 * (streamBeginCapture, streamEndCapture, streamCapturing, streamLaunchGraph, streamGraphKernels,
 * streamReleaseGraph) to the exports.
 */
void addStreamExports(Napi::Env env, Napi::Object exports);

}  // namespace kiln
