// Node-API glue: argument validation, ISA selection and the exported functions.
// Typed arrays are used in place (data pointer + byteOffset); sizes are element counts and
// every array is checked to be long enough before a kernel touches it.
#include <napi.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "gguf-repack.h"
#include "kernels.h"
#include "moe.h"
#include "quant.h"
#include "sampling.h"  // sampleRows
#include "stream.h"
#include "thread-pool.h"

namespace kiln {
namespace {

struct Features {
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512bf16 = false,
       avx512vnni = false, avx2 = false, fma = false;
};

Features detectFeatures() {
  Features f;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512vnni = __builtin_cpu_supports("avx512vnni");
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
  f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
#endif
#endif
  return f;
}

const Features kFeatures = detectFeatures();

bool supportsAvx512() {
  return kFeatures.avx512f && kFeatures.avx512bw && kFeatures.avx512vl && kFeatures.avx512dq &&
         kFeatures.fma;
}

// KILN_NATIVE_ISA=avx512-bf16|avx512|avx2|scalar (read once) forces a path; an unsupported request
// falls back to the best available one below it.
const KernelTable* chooseKernels() {
  const char* env = getenv("KILN_NATIVE_ISA");
  std::string want = env ? env : "";
#if defined(__x86_64__)
  if ((want.empty() || want == "avx512-bf16") && supportsAvx512() && kFeatures.avx512bf16)
    return &kAvx512Bf16Kernels;
  if ((want.empty() || want == "avx512" || want == "avx512-bf16") && supportsAvx512()) return &kAvx512Kernels;
  if ((want.empty() || want == "avx512" || want == "avx2") && kFeatures.avx2 && kFeatures.fma)
    return &kAvx2Kernels;
#endif
  return &kScalarKernels;
}

const KernelTable* gK = chooseKernels();

// Quantized kernels: VNNI path with the AVX-512 table (when the CPU has VNNI), the AVX2 path with any other
// vector table (an AVX-512 CPU without VNNI has AVX2), else portable loops.
const QuantTable* chooseQuant() {
#if defined(__x86_64__)
  if ((gK == &kAvx512Kernels || gK == &kAvx512Bf16Kernels) && kFeatures.avx512vnni) return &kQuantAvx512;
  if (gK != &kScalarKernels && kFeatures.avx2 && kFeatures.fma) return &kQuantAvx2;  // every AVX2 CPU has F16C
#endif
  return &kQuantScalar;
}
const QuantTable* gQ = chooseQuant();

// ---------------------------------------------------------------- argument helpers
template <typename T>
struct ArrayKind;
template <>
struct ArrayKind<float> {
  static constexpr napi_typedarray_type type = napi_float32_array;
  static constexpr const char* name = "Float32Array";
};
template <>
struct ArrayKind<uint16_t> {
  static constexpr napi_typedarray_type type = napi_uint16_array;
  static constexpr const char* name = "Uint16Array";
};
template <>
struct ArrayKind<uint8_t> {
  static constexpr napi_typedarray_type type = napi_uint8_array;
  static constexpr const char* name = "Uint8Array";
};
template <>
struct ArrayKind<int8_t> {
  static constexpr napi_typedarray_type type = napi_int8_array;
  static constexpr const char* name = "Int8Array";
};
template <>
struct ArrayKind<int32_t> {
  static constexpr napi_typedarray_type type = napi_int32_array;
  static constexpr const char* name = "Int32Array";
};

[[noreturn]] void fail(Napi::Env env, const std::string& op, const std::string& msg) {
  throw Napi::TypeError::New(env, "[" + op + "] " + msg);
}

// A typed array of T with at least `need` elements, from any JS value (array() for arguments, nested ones for moe).
template <typename T>
T* arrayOf(Napi::Env env, Napi::Value v, int64_t need, const char* op, const std::string& arg) {
  if (!v.IsTypedArray()) fail(env, op, arg + " must be a " + ArrayKind<T>::name);
  Napi::TypedArray ta = v.As<Napi::TypedArray>();
  if (ta.TypedArrayType() != ArrayKind<T>::type) fail(env, op, arg + " must be a " + ArrayKind<T>::name);
  if (need < 0 || static_cast<int64_t>(ta.ElementLength()) < need)
    throw Napi::RangeError::New(env, "[" + std::string(op) + "] " + arg + " has " + std::to_string(ta.ElementLength()) +
                                         " elements, needs " + std::to_string(need));
  auto* base = static_cast<uint8_t*>(ta.ArrayBuffer().Data());
  return reinterpret_cast<T*>(base + ta.ByteOffset());
}

template <typename T>
T* array(const Napi::CallbackInfo& info, size_t i, int64_t need, const char* op, const char* arg) {
  Napi::Env env = info.Env();
  if (i >= info.Length() || !info[i].IsTypedArray())
    fail(env, op, std::string(arg) + " must be a " + ArrayKind<T>::name);
  Napi::TypedArray ta = info[i].As<Napi::TypedArray>();
  if (ta.TypedArrayType() != ArrayKind<T>::type)
    fail(env, op, std::string(arg) + " must be a " + ArrayKind<T>::name);
  if (need < 0 || static_cast<int64_t>(ta.ElementLength()) < need)
    throw Napi::RangeError::New(env, "[" + std::string(op) + "] " + arg + " has " +
                                         std::to_string(ta.ElementLength()) + " elements, needs " +
                                         std::to_string(need));
  auto* base = static_cast<uint8_t*>(ta.ArrayBuffer().Data());
  return reinterpret_cast<T*>(base + ta.ByteOffset());
}

int64_t integer(const Napi::CallbackInfo& info, size_t i, const char* op, const char* arg,
                int64_t min = 0) {
  if (i >= info.Length() || !info[i].IsNumber()) fail(info.Env(), op, std::string(arg) + " must be a number");
  double d = info[i].As<Napi::Number>().DoubleValue();
  if (!(d >= static_cast<double>(min)) || d != static_cast<double>(static_cast<int64_t>(d)) || d > 9.0e15)
    throw Napi::RangeError::New(info.Env(), "[" + std::string(op) + "] " + arg +
                                                " must be an integer >= " + std::to_string(min));
  return static_cast<int64_t>(d);
}
double number(const Napi::CallbackInfo& info, size_t i, const char* op, const char* arg) {
  if (i >= info.Length() || !info[i].IsNumber()) fail(info.Env(), op, std::string(arg) + " must be a number");
  return info[i].As<Napi::Number>().DoubleValue();
}
bool boolean(const Napi::CallbackInfo& info, size_t i) { return i < info.Length() && info[i].ToBoolean().Value(); }

// Elements needed by `batch` items of `size` elements each, `stride` apart.
int64_t spanOf(int64_t batch, int64_t stride, int64_t size) {
  return size == 0 ? 0 : (batch - 1) * stride + size;
}

// ---------------------------------------------------------------- exported functions
Job Matmul(const Napi::CallbackInfo& info) {
  const char* op = "matmul";
  const int64_t M = integer(info, 3, op, "M"), N = integer(info, 4, op, "N"), K = integer(info, 5, op, "K");
  const bool bT = boolean(info, 6);
  const int64_t bDtype = integer(info, 7, op, "bDtype");
  const int64_t batch = integer(info, 8, op, "batch", 1);
  const int64_t sA = integer(info, 9, op, "strideA"), sB = integer(info, 10, op, "strideB"),
                sO = integer(info, 11, op, "strideOut");
  if (bDtype > 1) fail(info.Env(), op, "bDtype must be 0 (f32) or 1 (bf16)");
  if (batch > 1 && sO < M * N) fail(info.Env(), op, "strideOut must be >= M*N when batch > 1");
  MatmulArgs a{};
  a.a = array<float>(info, 0, spanOf(batch, sA, M * K), op, "a");
  a.b = bDtype == 1 ? static_cast<const void*>(array<uint16_t>(info, 1, spanOf(batch, sB, N * K), op, "b"))
                    : static_cast<const void*>(array<float>(info, 1, spanOf(batch, sB, N * K), op, "b"));
  a.out = array<float>(info, 2, spanOf(batch, sO, M * N), op, "out");
  a.M = M; a.N = N; a.K = K; a.bTransposed = bT; a.bDtype = static_cast<int>(bDtype);
  a.aTransposed = boolean(info, 12);  // optional: A stored [K,M], out = A^T @ B
  a.batch = batch; a.strideA = sA; a.strideB = sB; a.strideOut = sO;
  if (M == 0 || N == 0) return {op, nullptr};
  Job job{op, [a] { gK->matmul(a); }, nullptr};
  if (gemvGroupable(a)) job.gemv = std::make_shared<const GemvLaunch>(GemvLaunch{false, a, {}});
  return job;
}

// A scheme code quant.h knows, and K whole 64-element chunks for the group schemes.
void checkQuantScheme(const Napi::CallbackInfo& info, const char* op, int64_t scheme, int64_t K) {
  if (scheme < 0 || scheme >= kQuantSchemes)
    fail(info.Env(), op, "scheme must be 0 (int8), 1 (int4), 2 (fp8), 3 (int8 group-32), 4 (q4_k), 5 (mxfp4), 6 (q6_k), 7 (q5_k) or 8 (iq4_nl)");
  const bool grouped = scheme == kQuantInt4 || scheme == kQuantInt8G32 || scheme == kQuantMxfp4 || scheme == kQuantIq4Nl;
  if (grouped && K % 64 != 0) fail(info.Env(), op, "int4, int8 group-32, mxfp4 and iq4_nl need K to be a multiple of 64");
  if (quantSuperBlocks(scheme) && K % 256 != 0)
    fail(info.Env(), op, "q4_k, q5_k and q6_k need K to be a multiple of 256");
}
// The scales argument, typed as its layout stores it.
void* quantScalesArg(const Napi::CallbackInfo& info, size_t i, const char* op, int64_t scheme, int64_t N, int64_t K) {
  const int64_t bytes = quantScalesBytes(scheme, N, K);
  if (quantByteScales(scheme)) return array<uint8_t>(info, i, bytes, op, "scales");
  if (quantHalfScales(scheme)) return array<uint16_t>(info, i, bytes / 2, op, "scales");
  return array<float>(info, i, bytes / 4, op, "scales");
}

// quantMatmul(x, w, scales, rowSums, out, M, N, K, scheme): out = x @ dequant(W)^T, layouts in quant.h.
Job QuantMatmul(const Napi::CallbackInfo& info) {
  const char* op = "quantMatmul";
  const int64_t M = integer(info, 5, op, "M"), N = integer(info, 6, op, "N"), K = integer(info, 7, op, "K");
  const int64_t scheme = integer(info, 8, op, "scheme");
  checkQuantScheme(info, op, scheme, K);
  QuantMatmulArgs a{};
  a.x = array<float>(info, 0, M * K, op, "x");
  a.w = array<uint8_t>(info, 1, quantDataBytes(scheme, N, K), op, "w");
  a.scales = quantScalesArg(info, 2, op, scheme, N, K);
  a.rowSums = scheme == kQuantInt8 ? array<int32_t>(info, 3, N, op, "rowSums") : nullptr;
  a.out = array<float>(info, 4, M * N, op, "out");
  a.M = M; a.N = N; a.K = K; a.scheme = static_cast<int>(scheme);
  // optional pre-quantized x (args 9, 10: Int8Array [M, K], Float32Array [M]), as rmsNormQuant writes it
  if (info.Length() > 10 && !info[9].IsUndefined() && !info[9].IsNull()) {
    a.xq = array<int8_t>(info, 9, M * K, op, "xq");
    a.xs = array<float>(info, 10, M, op, "xs");
  }
  if (M == 0 || N == 0) return {op, nullptr};
  Job job{op, [a] { runQuantMatmul(*gQ, *gK, a); }, nullptr};
  if (quantGroupable(a)) job.gemv = std::make_shared<const GemvLaunch>(GemvLaunch{true, {}, a});
  return job;
}

// ---------------------------------------------------------------- step-graph GEMV merging (stream.h)
bool overlaps(const void* p, int64_t pBytes, const void* q, int64_t qBytes) {
  if (!p || !q) return false;
  const char* a = static_cast<const char*>(p);
  const char* b = static_cast<const char*>(q);
  return a < b + qBytes && b < a + pBytes;
}
// The bytes a GEMV launch reads (x, pre-quantized x and its scales, weights, weight scales, row sums) and writes.
struct Span {
  const void* p;
  int64_t bytes;
};
// The weight (codes for quantized ones) a GEMV launch streams.
Span weightOf(const GemvLaunch& g) {
  if (g.quant) return {g.q.w, quantDataBytes(g.q.scheme, g.q.N, g.q.K)};
  return {g.m.b, g.m.N * g.m.K * (g.m.bDtype == 1 ? 2 : 4)};
}
std::vector<Span> readsOf(const GemvLaunch& g) {
  if (!g.quant) return {{g.m.a, g.m.K * 4}, weightOf(g)};
  const QuantMatmulArgs& q = g.q;
  return {{q.x, q.K * 4}, {q.xq, q.xq ? q.K : 0}, {q.xs, q.xs ? 4 : 0}, weightOf(g),
          {q.scales, quantScalesBytes(q.scheme, q.N, q.K)}, {q.rowSums, q.rowSums ? q.N * 4 : 0}};
}
Span outOf(const GemvLaunch& g) { return g.quant ? Span{g.q.out, g.q.N * 4} : Span{g.m.out, g.m.N * 4}; }
// Whether `next` reads the same x as `first`, the same way (a group shares one activation prep).
bool sameX(const GemvLaunch& first, const GemvLaunch& next) {
  if (first.quant != next.quant) return false;
  if (!first.quant) return first.m.a == next.m.a && first.m.K == next.m.K && first.m.bDtype == next.m.bDtype;
  const QuantMatmulArgs &a = first.q, &b = next.q;
  return a.x == b.x && a.xq == b.xq && a.xs == b.xs && a.K == b.K && a.scheme == b.scheme;
}
// Whether two launches may run at once: neither writes what the other reads, and their outputs are apart.
bool independent(const GemvLaunch& a, const GemvLaunch& b) {
  const Span oa = outOf(a), ob = outOf(b);
  if (overlaps(oa.p, oa.bytes, ob.p, ob.bytes)) return false;
  for (const Span& r : readsOf(b))
    if (overlaps(oa.p, oa.bytes, r.p, r.bytes)) return false;
  for (const Span& r : readsOf(a))
    if (overlaps(ob.p, ob.bytes, r.p, r.bytes)) return false;
  return true;
}
}  // namespace

void mergeCapturedJobs(std::vector<Job>& jobs) {
  std::vector<Job> merged;
  merged.reserve(jobs.size());
  std::vector<std::vector<Span>> weights;  // per merged job: the weights a GEMV (group) reads, in row order
  for (size_t i = 0; i < jobs.size();) {
    size_t j = i + 1;
    // the group's launches run at once: each must be independent of every one before it in the group
    auto joins = [&](size_t next) {
      if (!jobs[next].gemv || !sameX(*jobs[i].gemv, *jobs[next].gemv)) return false;
      for (size_t k = i; k < next; ++k)
        if (!independent(*jobs[k].gemv, *jobs[next].gemv)) return false;
      return true;
    };
    if (jobs[i].gemv)
      while (j < jobs.size() && joins(j)) ++j;
    std::vector<Span> w;
    for (size_t k = i; k < j && jobs[i].gemv; ++k) w.push_back(weightOf(*jobs[k].gemv));
    weights.push_back(std::move(w));
    if (j - i < 2) {
      merged.push_back(std::move(jobs[i]));
      i = j;
      continue;
    }
    if (jobs[i].gemv->quant) {
      std::vector<QuantMatmulArgs> group;
      for (size_t k = i; k < j; ++k) group.push_back(jobs[k].gemv->q);
      merged.push_back({"quantMatmulGroup", [group] { gQ->matmulGroup(group.data(), static_cast<int>(group.size())); }, nullptr});
    } else {
      std::vector<MatmulArgs> group;
      for (size_t k = i; k < j; ++k) group.push_back(jobs[k].gemv->m);
      merged.push_back({"matmulGroup", [group] { gK->gemvGroup(group.data(), static_cast<int>(group.size())); }, nullptr});
    }
    i = j;
  }
  // The serial jobs between two GEMVs (attention, norms) leave the pool's worker idle: the first of them hints the
  // worker's half of the next GEMV's weight bytes (its share under an even cut), up to kPrefetchHintMax. With that,
  // the serial jobs cost the step little, so fusing them away would not pay much: a scratch build that skipped them
  // (timing only; SmolLM-135M Q8_0 decode steps at position 40, execute() in 30 alternating blocks of 15) took 1.015x
  // the time without the residual adds, 0.995x without those, the norms and silu*mul, 0.98x without attention, all
  // within that A/B's noise (identical builds read 0.984-1.024x); the step less its GEMV jobs came to 0.17-0.30 ms.
  constexpr int64_t kPrefetchHintMax = 512 << 10;
  size_t first = 0;  // the first job after the previous GEMV
  for (size_t k = 0; k < merged.size(); ++k) {
    if (weights[k].empty()) continue;
    if (first < k) {
      int64_t total = 0;
      for (const Span& s : weights[k]) total += s.bytes;
      int64_t skip = total / 2;
      for (const Span& s : weights[k]) {
        if (skip >= s.bytes) {
          skip -= s.bytes;
          continue;
        }
        merged[first].prefetch = static_cast<const char*>(s.p) + skip;
        merged[first].prefetchBytes = std::min<int64_t>(s.bytes - skip, kPrefetchHintMax);
        break;
      }
    }
    first = k + 1;
  }
  // Paged attention reads its cached K/V from DRAM at the memory's latency (one core, little else in flight): the
  // GEMV before it (the q/k/v projection) prefetches them as it streams (sideLines).
  for (size_t k = 1; k < merged.size(); ++k)
    if (merged[k].prefetchReads && !weights[k - 1].empty()) merged[k - 1].warm = merged[k].prefetchReads;
  jobs.swap(merged);
}

namespace {

// quantizeWeights(w, N, K, scheme, data, scales, rowSums): f32 [N, K] -> the layout of quant.h.
Job QuantizeWeights(const Napi::CallbackInfo& info) {
  const char* op = "quantizeWeights";
  const int64_t N = integer(info, 1, op, "N"), K = integer(info, 2, op, "K"), scheme = integer(info, 3, op, "scheme");
  if (quantSuperBlocks(scheme) || scheme == kQuantIq4Nl)
    fail(info.Env(), op, "q4_k, q5_k, q6_k and iq4_nl have no native quantizer (their weights are GGUF blocks)");
  checkQuantScheme(info, op, scheme, K);
  const float* w = array<float>(info, 0, N * K, op, "w");
  uint8_t* data = array<uint8_t>(info, 4, quantDataBytes(scheme, N, K), op, "data");
  void* scales = quantScalesArg(info, 5, op, scheme, N, K);
  int32_t* rowSums = scheme == kQuantInt8 ? array<int32_t>(info, 6, N, op, "rowSums") : nullptr;
  const int sch = static_cast<int>(scheme);
  return {op, [=] { gQ->quantize(sch, w, N, K, data, scales, rowSums); }};
}

// ---------------------------------------------------------------- strided kernels
constexpr int kMaxRank = 8;

// A strided operand: up to 8 dims of element strides read from an Int32Array (>= 0).
struct Dims {
  int rank = 0;
  int64_t v[kMaxRank] = {};
};
Dims dims(const Napi::CallbackInfo& info, size_t i, const char* op, const char* arg, int rank = -1) {
  if (i >= info.Length() || !info[i].IsTypedArray() ||
      info[i].As<Napi::TypedArray>().TypedArrayType() != napi_int32_array)
    fail(info.Env(), op, std::string(arg) + " must be an Int32Array");
  Napi::Int32Array a = info[i].As<Napi::Int32Array>();
  Dims d;
  d.rank = static_cast<int>(a.ElementLength());
  if (d.rank > kMaxRank) fail(info.Env(), op, std::string(arg) + ": rank above 8 is not supported");
  if (rank >= 0 && d.rank != rank) fail(info.Env(), op, std::string(arg) + " must have one entry per dim");
  const int32_t* p = a.Data();
  for (int k = 0; k < d.rank; ++k) {
    if (p[k] < 0) fail(info.Env(), op, std::string(arg) + " entries must be >= 0");
    d.v[k] = p[k];
  }
  return d;
}
// Elements an operand spans: 1 + the largest offset (0 when the shape is empty).
int64_t spanOfStrided(const Dims& shape, const Dims& strides) {
  int64_t last = 0;
  for (int d = 0; d < shape.rank; ++d) {
    if (shape.v[d] == 0) return 0;
    last += (shape.v[d] - 1) * strides.v[d];
  }
  return last + 1;
}
int64_t numelOf(const Dims& shape) {
  int64_t n = 1;
  for (int d = 0; d < shape.rank; ++d) n *= shape.v[d];
  return n;
}
Dims contiguousStrides(const Dims& shape) {
  Dims s;
  s.rank = shape.rank;
  int64_t acc = 1;
  for (int d = shape.rank - 1; d >= 0; --d) {
    s.v[d] = acc;
    acc *= shape.v[d];
  }
  return s;
}
// Drops size-1 dims and merges dim d into d-1 when every operand has stride[d-1] == stride[d]*shape[d].
// Leaves rank >= 1 (a single element becomes shape [1], unit strides).
void coalesce(Dims& shape, Dims* const* ops, int nops) {
  int r = 0;
  for (int d = 0; d < shape.rank; ++d) {
    if (shape.v[d] == 1) continue;
    bool merge = r > 0;
    for (int o = 0; o < nops && merge; ++o) merge = ops[o]->v[r - 1] == ops[o]->v[d] * shape.v[d];
    if (merge) {
      shape.v[r - 1] *= shape.v[d];
      for (int o = 0; o < nops; ++o) ops[o]->v[r - 1] = ops[o]->v[d];
      continue;
    }
    shape.v[r] = shape.v[d];
    for (int o = 0; o < nops; ++o) ops[o]->v[r] = ops[o]->v[d];
    ++r;
  }
  if (r == 0) {
    shape.v[0] = 1;
    for (int o = 0; o < nops; ++o) ops[o]->v[0] = 1;
    r = 1;
  }
  shape.rank = r;
  for (int o = 0; o < nops; ++o) ops[o]->rank = r;
}

// Any typed array viewed as elements of elemBytes from its byteOffset; returns base and element count.
uint8_t* bytesOf(const Napi::CallbackInfo& info, size_t i, int64_t elemBytes, int64_t need, const char* op,
                 const char* arg) {
  if (i >= info.Length() || !info[i].IsTypedArray()) fail(info.Env(), op, std::string(arg) + " must be a typed array");
  Napi::TypedArray ta = info[i].As<Napi::TypedArray>();
  if (ta.ByteOffset() % elemBytes != 0) fail(info.Env(), op, std::string(arg) + " is not aligned to elemBytes");
  const int64_t have = static_cast<int64_t>(ta.ByteLength()) / elemBytes;
  if (have < need)
    throw Napi::RangeError::New(info.Env(), "[" + std::string(op) + "] " + arg + " has " + std::to_string(have) +
                                                " elements, needs " + std::to_string(need));
  return static_cast<uint8_t*>(ta.ArrayBuffer().Data()) + ta.ByteOffset();
}

void checkNoOverlap(const Napi::CallbackInfo& info, const Dims& shape, const Dims& strides, const char* op) {
  for (int d = 0; d < shape.rank; ++d)
    if (shape.v[d] > 1 && strides.v[d] == 0) fail(info.Env(), op, "destination strides must not be 0 (broadcast)");
}

// copyPieces(src, dsts): src's bytes in consecutive pieces, piece i (dsts[i]'s byte length) into dsts[i]; the pieces
// must cover src exactly. One job for several stream-ordered host writes (a step's inputs, Backend.writeAsyncMany).
Job CopyPieces(const Napi::CallbackInfo& info) {
  const char* op = "copyPieces";
  Napi::Env env = info.Env();
  const uint8_t* src = bytesOf(info, 0, 1, 0, op, "src");
  const int64_t srcBytes = static_cast<int64_t>(info[0].As<Napi::TypedArray>().ByteLength());
  if (info.Length() < 2 || !info[1].IsArray()) fail(env, op, "dsts must be an array of typed arrays");
  Napi::Array list = info[1].As<Napi::Array>();
  std::vector<std::pair<uint8_t*, int64_t>> pieces;
  int64_t total = 0;
  for (uint32_t i = 0; i < list.Length(); ++i) {
    Napi::Value v = list.Get(i);
    if (!v.IsTypedArray()) fail(env, op, "dsts[" + std::to_string(i) + "] must be a typed array");
    Napi::TypedArray ta = v.As<Napi::TypedArray>();
    const int64_t n = static_cast<int64_t>(ta.ByteLength());
    uint8_t* d = static_cast<uint8_t*>(ta.ArrayBuffer().Data()) + ta.ByteOffset();
    if (overlaps(d, n, src, srcBytes)) fail(env, op, "dsts[" + std::to_string(i) + "] overlaps src");
    pieces.emplace_back(d, n);
    total += n;
  }
  if (total != srcBytes)
    throw Napi::RangeError::New(env, "[copyPieces] the pieces cover " + std::to_string(total) + " bytes of a " +
                                         std::to_string(srcBytes) + "-byte src");
  if (total == 0) return {op, nullptr};
  return {op, [src, pieces] {
            const uint8_t* s = src;
            for (const auto& [d, n] : pieces) memcpy(d, s, static_cast<size_t>(n)), s += n;
          }};
}

// copyStrided(src, dst, shape, srcStrides, dstStrides, elemBytes): a byte copy of any 1/2/4/8-byte dtype.
Job CopyStrided(const Napi::CallbackInfo& info) {
  const char* op = "copyStrided";
  Dims shape = dims(info, 2, op, "shape");
  Dims ss = dims(info, 3, op, "srcStrides", shape.rank), ds = dims(info, 4, op, "dstStrides", shape.rank);
  const int64_t eb = integer(info, 5, op, "elemBytes", 1);
  if (eb != 1 && eb != 2 && eb != 4 && eb != 8) fail(info.Env(), op, "elemBytes must be 1, 2, 4 or 8");
  checkNoOverlap(info, shape, ds, op);
  const void* src = bytesOf(info, 0, eb, spanOfStrided(shape, ss), op, "src");
  void* dst = bytesOf(info, 1, eb, spanOfStrided(shape, ds), op, "dst");
  if (numelOf(shape) == 0) return {op, nullptr};
  Dims* ops[2] = {&ss, &ds};
  coalesce(shape, ops, 2);
  // the kernel permutes its dim arrays in place: work on copies so the job can be replayed (step graphs)
  return {op, [=] {
            Dims sh = shape, s = ss, d = ds;
            gK->copyStrided(src, dst, sh.rank, sh.v, s.v, d.v, static_cast<int>(eb));
          }};
}

// binaryStrided and compareStrided(op, a, aStrides, b, bStrides, out, shape): f32 operands read through strides, out
// a contiguous array of Out (f32; compareStrided's bytes 0/1), run by `kernel` (a KernelTable field) with op codes up
// to maxCode.
template <class Out>
using StridedPairKernel = void (*KernelTable::*)(int, const float*, int64_t*, const float*, int64_t*, Out*, int, const int64_t*);
template <class Out>
Job stridedPairJob(const Napi::CallbackInfo& info, const char* op, int64_t maxCode, StridedPairKernel<Out> kernel) {
  const int64_t opc = integer(info, 0, op, "op");
  if (opc > maxCode) fail(info.Env(), op, "unknown op code " + std::to_string(opc));
  Dims shape = dims(info, 6, op, "shape");
  Dims as = dims(info, 2, op, "aStrides", shape.rank), bs = dims(info, 4, op, "bStrides", shape.rank);
  Dims os = contiguousStrides(shape);
  const float* a = array<float>(info, 1, spanOfStrided(shape, as), op, "a");
  const float* b = array<float>(info, 3, spanOfStrided(shape, bs), op, "b");
  Out* out = array<Out>(info, 5, numelOf(shape), op, "out");
  if (numelOf(shape) == 0) return {op, nullptr};
  Dims* ops[3] = {&as, &bs, &os};
  coalesce(shape, ops, 3);
  const int code = static_cast<int>(opc);
  return {op, [=] {  // copies: the kernel takes non-const stride arrays and the job may be replayed
            Dims sa = as, sb = bs;
            (gK->*kernel)(code, a, sa.v, b, sb.v, out, shape.rank, shape.v);
          }};
}
Job BinaryStrided(const Napi::CallbackInfo& info) {
  return stridedPairJob<float>(info, "binaryStrided", 6, &KernelTable::binaryStrided);
}
Job CompareStrided(const Napi::CallbackInfo& info) {
  return stridedPairJob<uint8_t>(info, "compareStrided", 5, &KernelTable::compareStrided);
}

// whereStrided(cond: Uint8Array, condStrides, a, aStrides, b, bStrides, out, shape): f32, out contiguous.
Job WhereStrided(const Napi::CallbackInfo& info) {
  const char* op = "whereStrided";
  Dims shape = dims(info, 7, op, "shape");
  Dims cs = dims(info, 1, op, "condStrides", shape.rank), as = dims(info, 3, op, "aStrides", shape.rank),
       bs = dims(info, 5, op, "bStrides", shape.rank);
  Dims os = contiguousStrides(shape);
  const uint8_t* c = array<uint8_t>(info, 0, spanOfStrided(shape, cs), op, "cond");
  const float* a = array<float>(info, 2, spanOfStrided(shape, as), op, "a");
  const float* b = array<float>(info, 4, spanOfStrided(shape, bs), op, "b");
  float* out = array<float>(info, 6, numelOf(shape), op, "out");
  if (numelOf(shape) == 0) return {op, nullptr};
  Dims* ops[4] = {&cs, &as, &bs, &os};
  coalesce(shape, ops, 4);
  return {op, [=] {  // copies: the kernel takes non-const stride arrays and the job may be replayed
            Dims sc = cs, sa = as, sb = bs;
            gK->whereStrided(c, sc.v, a, sa.v, b, sb.v, out, shape.rank, shape.v);
          }};
}

Job Unary(const Napi::CallbackInfo& info) {
  const int64_t opc = integer(info, 0, "unary", "op"), n = integer(info, 3, "unary", "n");
  if (opc > 15) fail(info.Env(), "unary", "unknown op code " + std::to_string(opc));
  const float* x = array<float>(info, 1, n, "unary", "x");
  float* out = array<float>(info, 2, n, "unary", "out");
  return {"unary", [=] { gK->unary(static_cast<int>(opc), x, out, n); }};
}

Job Binary(const Napi::CallbackInfo& info) {
  const char* op = "binary";
  const int64_t opc = integer(info, 0, op, "op"), n = integer(info, 4, op, "n"), bn = integer(info, 5, op, "bn", 1);
  if (opc > 6) fail(info.Env(), op, "unknown op code " + std::to_string(opc));
  if (n % bn != 0) throw Napi::RangeError::New(info.Env(), "[binary] bn must divide n");
  const float* a = array<float>(info, 1, n, op, "a");
  const float* b = array<float>(info, 2, bn, op, "b");
  float* out = array<float>(info, 3, n, op, "out");
  return {op, [=] { gK->binary(static_cast<int>(opc), a, b, out, n, bn); }};
}

Job SiluMul(const Napi::CallbackInfo& info) {
  const int64_t n = integer(info, 3, "siluMul", "n");
  const float* gate = array<float>(info, 0, n, "siluMul", "gate");
  const float* up = array<float>(info, 1, n, "siluMul", "up");
  float* out = array<float>(info, 2, n, "siluMul", "out");
  return {"siluMul", [=] { gK->siluMul(gate, up, out, n); }};
}

// siluMulQuant(gate, up, out, rows, n, xq, xs): siluMul over [rows, n], then out's rows quantized for quant matmul
// (QuantTable::quantizeRows) while they are hot: the down projection reads them instead of quantizing out.
Job SiluMulQuant(const Napi::CallbackInfo& info) {
  const char* op = "siluMulQuant";
  const int64_t rows = integer(info, 3, op, "rows"), n = integer(info, 4, op, "n");
  const float* gate = array<float>(info, 0, rows * n, op, "gate");
  const float* up = array<float>(info, 1, rows * n, op, "up");
  float* out = array<float>(info, 2, rows * n, op, "out");
  int8_t* xq = array<int8_t>(info, 5, rows * n, op, "xq");
  float* xs = array<float>(info, 6, rows, op, "xs");
  return {op, [=] {
            gK->siluMul(gate, up, out, rows * n);
            gQ->quantizeRows(out, rows, n, xq, xs);
          }};
}

Job RmsNorm(const Napi::CallbackInfo& info) {
  const char* op = "rmsNorm";
  const int64_t rows = integer(info, 3, op, "rows"), n = integer(info, 4, op, "n");
  const float eps = static_cast<float>(number(info, 5, op, "eps"));
  const float* x = array<float>(info, 0, rows * n, op, "x");
  const float* w = array<float>(info, 1, n, op, "weight");
  float* out = array<float>(info, 2, rows * n, op, "out");
  return {op, [=] { gK->rmsNorm(x, w, out, rows, n, eps); }};
}

// rmsNormQuant(x, weight, out, rows, n, eps, xq, xs): rmsNorm, then out's rows quantized for quant matmul
// (QuantTable::quantizeRows) while they are hot: one job where quantMatmul would quantize out once per consumer.
Job RmsNormQuant(const Napi::CallbackInfo& info) {
  const char* op = "rmsNormQuant";
  const int64_t rows = integer(info, 3, op, "rows"), n = integer(info, 4, op, "n");
  const float eps = static_cast<float>(number(info, 5, op, "eps"));
  const float* x = array<float>(info, 0, rows * n, op, "x");
  const float* w = array<float>(info, 1, n, op, "weight");
  float* out = array<float>(info, 2, rows * n, op, "out");
  int8_t* xq = array<int8_t>(info, 6, rows * n, op, "xq");
  float* xs = array<float>(info, 7, rows, op, "xs");
  return {op, [=] {
            gK->rmsNorm(x, w, out, rows, n, eps);
            gQ->quantizeRows(out, rows, n, xq, xs);
          }};
}

// addRmsNorm(x, residual, weight, sum, out, rows, n, eps[, xq, xs]): sum = x + residual, out = rmsNorm(sum) (vLLM's
// fused_add_rms_norm: a decoder layer's residual add and the next norm in one job); with xq and xs, out's rows are
// also quantized for quant matmul, as rmsNormQuant does
Job AddRmsNorm(const Napi::CallbackInfo& info) {
  const char* op = "addRmsNorm";
  const int64_t rows = integer(info, 5, op, "rows"), n = integer(info, 6, op, "n");
  const float eps = static_cast<float>(number(info, 7, op, "eps"));
  const float* x = array<float>(info, 0, rows * n, op, "x");
  const float* r = array<float>(info, 1, rows * n, op, "residual");
  const float* w = array<float>(info, 2, n, op, "weight");
  float* sum = array<float>(info, 3, rows * n, op, "sum");
  float* out = array<float>(info, 4, rows * n, op, "out");
  if (info.Length() <= 8 || info[8].IsUndefined()) return {op, [=] { gK->addRmsNorm(x, r, w, sum, out, rows, n, eps); }};
  int8_t* xq = array<int8_t>(info, 8, rows * n, op, "xq");
  float* xs = array<float>(info, 9, rows, op, "xs");
  return {op, [=] {
            gK->addRmsNorm(x, r, w, sum, out, rows, n, eps);
            gQ->quantizeRows(out, rows, n, xq, xs);
          }};
}

Job Softmax(const Napi::CallbackInfo& info) {
  const char* op = "softmax";
  const int64_t rows = integer(info, 2, op, "rows"), n = integer(info, 3, op, "n");
  const float* x = array<float>(info, 0, rows * n, op, "x");
  float* out = array<float>(info, 1, rows * n, op, "out");
  const bool log = boolean(info, 4);
  return {op, [=] { gK->softmax(x, out, rows, n, log); }};
}

Job Reduce(const Napi::CallbackInfo& info) {
  const char* op = "reduce";
  const int64_t opc = integer(info, 0, op, "op"), rows = integer(info, 3, op, "rows"), n = integer(info, 4, op, "n");
  if (opc > 2) fail(info.Env(), op, "unknown op code " + std::to_string(opc));
  const float* x = array<float>(info, 1, rows * n, op, "x");
  float* out = array<float>(info, 2, rows, op, "out");
  return {op, [=] { gK->reduce(static_cast<int>(opc), x, out, rows, n); }};
}

Job Argmax(const Napi::CallbackInfo& info) {
  const char* op = "argmax";
  const int64_t rows = integer(info, 2, op, "rows"), n = integer(info, 3, op, "n", 1);
  const float* x = array<float>(info, 0, rows * n, op, "x");
  int32_t* out = array<int32_t>(info, 1, rows, op, "out");
  return {op, [=] { gK->argmax(x, out, rows, n); }};
}

Job Rotary(const Napi::CallbackInfo& info) {
  const char* op = "rotary";
  const int64_t T = integer(info, 5, op, "T"), H = integer(info, 6, op, "H"), D = integer(info, 7, op, "D"),
                rd = integer(info, 8, op, "rotaryDim");
  if (rd % 2 != 0 || rd > D) fail(info.Env(), op, "rotaryDim must be even and <= D");
  const float* x = array<float>(info, 0, T * H * D, op, "x");
  const int32_t* pos = array<int32_t>(info, 1, T, op, "positions");
  Napi::TypedArray cosArr = info[2].As<Napi::TypedArray>();
  const float* c = array<float>(info, 2, 0, op, "cos");
  const float* s = array<float>(info, 3, static_cast<int64_t>(cosArr.ElementLength()), op, "sin");
  const int64_t maxPos = rd == 0 ? 0 : static_cast<int64_t>(cosArr.ElementLength()) / (rd / 2);
  for (int64_t t = 0; t < T; ++t)
    if (rd > 0 && (pos[t] < 0 || pos[t] >= maxPos))
      throw Napi::RangeError::New(info.Env(), "[rotary] position " + std::to_string(pos[t]) +
                                                  " outside the cos/sin table (" + std::to_string(maxPos) + ")");
  float* out = array<float>(info, 4, T * H * D, op, "out");
  const bool neox = boolean(info, 9);
  if (rd > 0) return {op, [=] { gK->rotary(x, pos, c, s, out, T, H, D, rd, neox); }};
  if (out == x) return {op, nullptr};
  return {op, [=] { memmove(out, x, sizeof(float) * T * H * D); }};
}

// Queues (sideLines) the K and V cache rows paged attention will read for its sequences' cached positions (those
// before each sequence's new tokens), up to kWarmKvMax bytes in all.
void queueCachedKv(const PagedAttentionArgs& p, int64_t numBlocks) {
  constexpr int64_t kWarmKvMax = 256 << 10;
  const int64_t elem = p.cacheFp8 ? 1 : p.cacheBf16 ? 2 : 4, row = p.Hkv * p.D * elem;
  SideLines* side = sideLines();
  side->clear();
  int64_t left = kWarmKvMax;
  for (int64_t s = 0; s < p.numSeqs && left > 0; ++s) {
    const int64_t cached = p.seqLens[s] - (p.queryStart[s + 1] - p.queryStart[s]);
    const int64_t lo = p.slidingWindow > 0 ? std::max<int64_t>(0, cached - p.slidingWindow) : 0;
    for (int64_t c = lo; c < cached && left > 0; c += p.blockSize - c % p.blockSize) {
      const int32_t id = p.blockTables[s * p.maxBlocksPerSeq + c / p.blockSize];
      if (id < 0 || id >= numBlocks) return;
      const int64_t first = c % p.blockSize, n = std::min(p.blockSize - first, cached - c);
      const int64_t off = (static_cast<int64_t>(id) * p.blockSize + first) * row, bytes = n * row;
      side->add(static_cast<const char*>(p.kCache) + off, bytes);
      side->add(static_cast<const char*>(p.vCache) + off, bytes);
      left -= 2 * bytes;
    }
  }
}

Job PagedAttention(const Napi::CallbackInfo& info) {
  const char* op = "pagedAttention";
  PagedAttentionArgs p{};
  p.numSeqs = integer(info, 10, op, "numSeqs");
  p.Hq = integer(info, 11, op, "Hq", 1);
  p.Hkv = integer(info, 12, op, "Hkv", 1);
  p.D = integer(info, 13, op, "D", 1);
  p.blockSize = integer(info, 14, op, "blockSize", 1);
  p.maxBlocksPerSeq = integer(info, 15, op, "maxBlocksPerSeq");
  p.scale = static_cast<float>(number(info, 16, op, "scale"));
  p.slidingWindow = integer(info, 17, op, "slidingWindow");
  Napi::Env env = info.Env();
  if (p.Hq % p.Hkv != 0) fail(env, op, "Hq must be a multiple of Hkv");
  if (p.D > 1024) fail(env, op, "head dim above 1024 is not supported");
  p.queryStart = array<int32_t>(info, 7, p.numSeqs + 1, op, "queryStart");
  const int64_t T = p.queryStart[p.numSeqs];
  p.seqLens = array<int32_t>(info, 8, p.numSeqs, op, "seqLens");
  p.blockTables = array<int32_t>(info, 6, p.numSeqs * p.maxBlocksPerSeq, op, "blockTables");
  p.slotMapping = array<int32_t>(info, 5, T, op, "slotMapping");
  p.q = array<float>(info, 0, T * p.Hq * p.D, op, "q");
  p.kNew = array<float>(info, 1, T * p.Hkv * p.D, op, "kNew");
  p.vNew = array<float>(info, 2, T * p.Hkv * p.D, op, "vNew");
  // caches: Float32Array, Uint16Array of bf16 bits, or Uint8Array of fp8 bytes (both the same), the fp8 format named
  // by arg 23 (1: e4m3fn, 2: e5m2)
  const napi_typedarray_type cacheType =
      info.Length() > 3 && info[3].IsTypedArray() ? info[3].As<Napi::TypedArray>().TypedArrayType() : napi_float32_array;
  p.cacheBf16 = cacheType == napi_uint16_array;
  if (cacheType == napi_uint8_array) {
    p.cacheFp8 = static_cast<int>(integer(info, 23, op, "fp8Format", 1));
    if (p.cacheFp8 != 1 && p.cacheFp8 != 2) fail(info.Env(), op, "fp8Format must be 1 (e4m3fn) or 2 (e5m2)");
  }
  auto cache = [&](size_t i, int64_t need, const char* name) -> void* {
    if (p.cacheBf16) return array<uint16_t>(info, i, need, op, name);
    if (p.cacheFp8) return array<uint8_t>(info, i, need, op, name);
    return array<float>(info, i, need, op, name);
  };
  p.kCache = cache(3, 0, "kCache");
  const int64_t cacheLen = static_cast<int64_t>(info[3].As<Napi::TypedArray>().ElementLength());
  p.vCache = cache(4, cacheLen, "vCache");
  p.out = array<float>(info, 9, T * p.Hq * p.D, op, "out");
  const int64_t slotSize = p.Hkv * p.D;
  const int64_t numBlocks = cacheLen / (p.blockSize * slotSize);
  // Validate indices so a bad table can never read or write outside the cache.
  if (p.queryStart[0] != 0) fail(env, op, "queryStart[0] must be 0");
  for (int64_t s = 0; s < p.numSeqs; ++s) {
    const int64_t qlen = p.queryStart[s + 1] - p.queryStart[s];
    if (qlen < 0) fail(env, op, "queryStart must be non-decreasing");
    if (p.seqLens[s] < qlen) fail(env, op, "seqLens[" + std::to_string(s) + "] is shorter than its query");
    const int64_t blocks = (static_cast<int64_t>(p.seqLens[s]) + p.blockSize - 1) / p.blockSize;
    if (blocks > p.maxBlocksPerSeq) fail(env, op, "seqLens[" + std::to_string(s) + "] exceeds maxBlocksPerSeq");
    for (int64_t b = 0; b < blocks; ++b) {
      const int32_t id = p.blockTables[s * p.maxBlocksPerSeq + b];
      if (id < 0 || id >= numBlocks)
        throw Napi::RangeError::New(env, "[pagedAttention] block id " + std::to_string(id) + " out of range");
    }
  }
  for (int64_t t = 0; t < T; ++t)
    if (p.slotMapping[t] >= numBlocks * p.blockSize)
      throw Napi::RangeError::New(env, "[pagedAttention] slot " + std::to_string(p.slotMapping[t]) + " out of range");
  // optional fused rotary: positions, cos, sin, rotaryDim, neox (args 18..22); rotaryDim 0 / absent = none
  if (info.Length() > 21 && !info[18].IsUndefined() && !info[18].IsNull()) {
    p.rotaryDim = integer(info, 21, op, "rotaryDim");
    if (p.rotaryDim % 2 != 0 || p.rotaryDim > p.D) fail(env, op, "rotaryDim must be even and <= D");
    p.positions = array<int32_t>(info, 18, T, op, "positions");
    p.cosT = array<float>(info, 19, 0, op, "cos");
    const int64_t tableLen = static_cast<int64_t>(info[19].As<Napi::TypedArray>().ElementLength());
    p.sinT = array<float>(info, 20, tableLen, op, "sin");
    p.neox = boolean(info, 22);
    const int64_t maxPos = p.rotaryDim == 0 ? 0 : tableLen / (p.rotaryDim / 2);
    for (int64_t t = 0; t < T && p.rotaryDim > 0; ++t)
      if (p.positions[t] < 0 || p.positions[t] >= maxPos)
        throw Napi::RangeError::New(env, "[pagedAttention] position " + std::to_string(p.positions[t]) +
                                             " outside the cos/sin table (" + std::to_string(maxPos) + ")");
  }
  // optional attention logit soft-capping (arg 24; 0 / absent = none)
  if (info.Length() > 24 && !info[24].IsUndefined() && !info[24].IsNull()) {
    const double cap = number(info, 24, op, "softcap");
    if (!(cap >= 0) || !std::isfinite(cap)) fail(env, op, "softcap must be a finite number >= 0");
    p.softcap = static_cast<float>(cap);
  }
  // optional attention sinks (arg 25): Float32Array [Hq]; absent = none
  if (info.Length() > 25 && !info[25].IsUndefined() && !info[25].IsNull()) {
    p.sinks = array<float>(info, 25, p.Hq, op, "sinks");
    for (int64_t h = 0; h < p.Hq; ++h)
      if (!std::isfinite(p.sinks[h])) fail(env, op, "sinks must be finite");
  }
  // optional full (non-causal) attention (arg 26); absent = causal
  p.bidirectional = info.Length() > 26 && boolean(info, 26);
  if (T == 0) return {op, nullptr};
  Job job{op, [p] { gK->pagedAttention(p); }};
  job.prefetchReads = [p, numBlocks] { queueCachedKv(p, numBlocks); };
  return job;
}

// The shape, mask and scale arguments shared by flashAttention and flashAttentionBackward, from argument `at` on:
// docs (Int32Array [B * S] or null), spans (Int32Array of [a, e) pairs, copied into `spans`), B, Hq, Hkv, S, Sk, D,
// scale, softcap, window.
FlashAttentionArgs flashArgs(const Napi::CallbackInfo& info, size_t at, const char* op, std::vector<int32_t>& spans) {
  Napi::Env env = info.Env();
  FlashAttentionArgs p{};
  p.B = integer(info, at + 2, op, "B");
  p.Hq = integer(info, at + 3, op, "Hq", 1);
  p.Hkv = integer(info, at + 4, op, "Hkv", 1);
  p.S = integer(info, at + 5, op, "S");
  p.Sk = integer(info, at + 6, op, "Sk");
  p.D = integer(info, at + 7, op, "D", 1);
  p.scale = static_cast<float>(number(info, at + 8, op, "scale"));
  const double cap = number(info, at + 9, op, "softcap");
  if (!(cap >= 0) || !std::isfinite(cap)) fail(env, op, "softcap must be a finite number >= 0");
  p.softcap = static_cast<float>(cap);
  p.window = integer(info, at + 10, op, "window");
  if (p.Hq % p.Hkv != 0) fail(env, op, "Hq must be a multiple of Hkv");
  if (p.Sk < p.S) fail(env, op, "Sk must be >= S (queries are the last S positions)");
  if (!info[at].IsNull() && !info[at].IsUndefined()) {
    if (p.Sk != p.S) fail(env, op, "documents need S == Sk");
    p.docs = array<int32_t>(info, at, p.B * p.S, op, "docs");
  }
  const Napi::Int32Array sp = info[at + 1].As<Napi::Int32Array>();
  const int32_t* given = array<int32_t>(info, at + 1, 0, op, "spans");
  const int64_t n = static_cast<int64_t>(sp.ElementLength());
  if (n % 2 != 0) fail(env, op, "spans must hold [start, end) pairs");
  spans.assign(given, given + n);
  for (int64_t i = 0; i < n; i += 2)
    if (spans[i] < 0 || spans[i] > spans[i + 1] || spans[i + 1] > p.Sk) fail(env, op, "a span lies outside [0, Sk]");
  p.nSpans = n / 2;
  // optional sinks [Hq] (arg at + 11)
  if (info.Length() > at + 11 && !info[at + 11].IsUndefined() && !info[at + 11].IsNull()) {
    p.sinks = array<float>(info, at + 11, p.Hq, op, "sinks");
    for (int64_t h = 0; h < p.Hq; ++h)
      if (!std::isfinite(p.sinks[h])) fail(env, op, "sinks must be finite");
  }
  return p;
}

// flashAttention(q, k, v, out, lse, docs, spans, B, Hq, Hkv, S, Sk, D, scale, softcap, window[, sinks]):
// KernelTable::flashAttention.
Job FlashAttention(const Napi::CallbackInfo& info) {
  const char* op = "flashAttention";
  std::vector<int32_t> spans;
  FlashAttentionArgs p = flashArgs(info, 5, op, spans);
  const int64_t qn = p.B * p.Hq * p.S * p.D, kn = p.B * p.Hkv * p.Sk * p.D;
  p.q = array<float>(info, 0, qn, op, "q");
  p.k = array<float>(info, 1, kn, op, "k");
  p.v = array<float>(info, 2, kn, op, "v");
  p.out = array<float>(info, 3, qn, op, "out");
  p.lse = array<float>(info, 4, p.B * p.Hq * p.S, op, "lse");
  if (qn == 0) return {op, nullptr};
  return {op, [p, spans]() mutable {
            p.spans = spans.data();
            gK->flashAttention(p);
          }};
}

// flashAttentionBackward(q, k, v, o, dout, lse, dq, dk, dv, docs, spans, B, Hq, Hkv, S, Sk, D, scale, softcap,
// window[, sinks, dsinks]): KernelTable::flashAttentionBackward (dq, dk, dv and dsinks overwritten).
Job FlashAttentionBackward(const Napi::CallbackInfo& info) {
  const char* op = "flashAttentionBackward";
  std::vector<int32_t> spans;
  FlashAttentionArgs p = flashArgs(info, 9, op, spans);
  const int64_t qn = p.B * p.Hq * p.S * p.D, kn = p.B * p.Hkv * p.Sk * p.D;
  p.q = array<float>(info, 0, qn, op, "q");
  p.k = array<float>(info, 1, kn, op, "k");
  p.v = array<float>(info, 2, kn, op, "v");
  p.o = array<float>(info, 3, qn, op, "o");
  p.dout = array<float>(info, 4, qn, op, "dout");
  p.lse = array<float>(info, 5, p.B * p.Hq * p.S, op, "lse");
  p.dq = array<float>(info, 6, qn, op, "dq");
  p.dk = array<float>(info, 7, kn, op, "dk");
  p.dv = array<float>(info, 8, kn, op, "dv");
  if (p.sinks) p.dsinks = array<float>(info, 21, p.Hq, op, "dsinks");
  if (qn == 0 && kn == 0) return {op, nullptr};
  return {op, [p, spans]() mutable {
            p.spans = spans.data();
            gK->flashAttentionBackward(p);
          }};
}

Job Embedding(const Napi::CallbackInfo& info) {
  const char* op = "embedding";
  const int64_t dtype = integer(info, 1, op, "tableDtype"), numIds = integer(info, 4, op, "numIds"),
                dim = integer(info, 5, op, "dim");
  if (dtype > 1) fail(info.Env(), op, "tableDtype must be 0 (f32) or 1 (bf16)");
  const void* table = dtype == 1 ? static_cast<const void*>(array<uint16_t>(info, 0, 0, op, "table"))
                                 : static_cast<const void*>(array<float>(info, 0, 0, op, "table"));
  const int64_t rows = dim == 0 ? 0 : static_cast<int64_t>(info[0].As<Napi::TypedArray>().ElementLength()) / dim;
  const int32_t* ids = array<int32_t>(info, 2, numIds, op, "ids");
  for (int64_t i = 0; i < numIds; ++i)
    if (ids[i] < 0 || ids[i] >= rows)
      throw Napi::RangeError::New(info.Env(), "[embedding] id " + std::to_string(ids[i]) + " out of range [0, " +
                                                  std::to_string(rows) + ")");
  float* out = array<float>(info, 3, numIds * dim, op, "out");
  const int dt = static_cast<int>(dtype);
  return {op, [=] { gK->embedding(table, dt, ids, out, numIds, dim); }};
}

// quantEmbedding(w, scales, ids, out, numIds, N, K, scheme): out [numIds, K] = rows ids of an [N, K] quantized weight
// (quantMatmul's layouts), dequantized (QuantTable::dequantRow): an embedding table kept in its GGUF blocks. The ids
// are checked here (a RangeError, as embedding's); a replay whose ids changed since the capture writes zeros for any
// outside [0, N) rather than read out of range.
Job QuantEmbedding(const Napi::CallbackInfo& info) {
  const char* op = "quantEmbedding";
  const int64_t numIds = integer(info, 4, op, "numIds"), N = integer(info, 5, op, "N"), K = integer(info, 6, op, "K");
  const int64_t scheme = integer(info, 7, op, "scheme");
  checkQuantScheme(info, op, scheme, K);
  const uint8_t* w = array<uint8_t>(info, 0, quantDataBytes(scheme, N, K), op, "w");
  const void* scales = quantScalesArg(info, 1, op, scheme, N, K);
  const int32_t* ids = array<int32_t>(info, 2, numIds, op, "ids");
  for (int64_t i = 0; i < numIds; ++i)
    if (ids[i] < 0 || ids[i] >= N)
      throw Napi::RangeError::New(info.Env(), "id " + std::to_string(ids[i]) + " out of range [0, " +
                                                  std::to_string(N) + ")");
  float* out = array<float>(info, 3, numIds * K, op, "out");
  const int sc = static_cast<int>(scheme);
  return {op, [=] {
            for (int64_t i = 0; i < numIds; ++i) {
              if (ids[i] >= 0 && ids[i] < N) gQ->dequantRow(sc, w, scales, ids[i], K, out + i * K);
              else std::fill(out + i * K, out + (i + 1) * K, 0.0f);
            }
          }};
}

// indexAddRows(out, ids, src, numIds, dim): out[ids[i], :] += src[i, :] (index_add_ along dim 0 of a [rows, dim] f32
// table, rows = out's length / dim: an embedding's gradient), ids in order. The ids are checked here; a replay whose
// ids changed since the capture skips any outside [0, rows).
Job IndexAddRows(const Napi::CallbackInfo& info) {
  const char* op = "indexAddRows";
  const int64_t numIds = integer(info, 3, op, "numIds"), dim = integer(info, 4, op, "dim");
  float* out = array<float>(info, 0, 0, op, "out");
  const int64_t rows = dim == 0 ? 0 : static_cast<int64_t>(info[0].As<Napi::TypedArray>().ElementLength()) / dim;
  const int32_t* ids = array<int32_t>(info, 1, numIds, op, "ids");
  const float* src = array<float>(info, 2, numIds * dim, op, "src");
  for (int64_t i = 0; i < numIds; ++i)
    if (ids[i] < 0 || ids[i] >= rows)
      throw Napi::RangeError::New(info.Env(), "index " + std::to_string(ids[i]) + " out of range for " + std::to_string(rows) + " rows");
  return {op, [=] {
            for (int64_t i = 0; i < numIds; ++i) {
              if (ids[i] < 0 || ids[i] >= rows) continue;
              float* o = out + ids[i] * dim;
              const float* s = src + i * dim;
              for (int64_t d = 0; d < dim; ++d) o[d] += s[d];
            }
          }};
}

// loraApply(base, x, a, b, scales, slots, out, T, N, K, R, S): multi-LoRA (KernelTable::loraApply). The kernel skips a
// slot outside [0, S) when it runs, so a replay whose slots changed since the capture still reads nothing out of range.
Job LoraApply(const Napi::CallbackInfo& info) {
  const char* op = "loraApply";
  const int64_t T = integer(info, 7, op, "T"), N = integer(info, 8, op, "N"), K = integer(info, 9, op, "K"),
                R = integer(info, 10, op, "R"), S = integer(info, 11, op, "S");
  const float* base = array<float>(info, 0, T * N, op, "base");
  const float* x = array<float>(info, 1, T * K, op, "x");
  const float* a = array<float>(info, 2, S * R * K, op, "a");
  const float* b = array<float>(info, 3, S * R * N, op, "b");
  const float* scales = array<float>(info, 4, S, op, "scales");
  const int32_t* slots = array<int32_t>(info, 5, T, op, "slots");
  float* out = array<float>(info, 6, T * N, op, "out");
  if (T == 0 || N == 0) return {op, nullptr};
  return {op, [=] { gK->loraApply(base, x, a, b, scales, slots, out, T, N, K, R, S); }};
}

// moe(x, ids, weights, out, T, H, I, K, E, act, alpha, limit, kinds, projections): the experts of a top-k MoE
// (moe.h MoeArgs). kinds Int32Array [3E]: per projection (gate, up, down of expert 0, then 1, ...) 0 f32, 1 bf16 or
// 2 + quant scheme; projections: an Array of 3E arrays [w, scales, rowSums, bias] (null where absent). The ids are
// read, and bounds-checked, when the job runs.
Job Moe(const Napi::CallbackInfo& info) {
  const char* op = "moe";
  Napi::Env env = info.Env();
  const int64_t T = integer(info, 4, op, "T"), H = integer(info, 5, op, "H", 1), I = integer(info, 6, op, "I", 1),
                K = integer(info, 7, op, "K", 1), E = integer(info, 8, op, "E", 1), act = integer(info, 9, op, "act");
  if (act > 1) fail(env, op, "act must be 0 (silu) or 1 (clamped SwiGLU)");
  auto args = std::make_shared<MoeArgs>();
  MoeArgs& a = *args;
  a.x = array<float>(info, 0, T * H, op, "x");
  a.ids = array<int32_t>(info, 1, T * K, op, "ids");
  a.weights = array<float>(info, 2, T * K, op, "weights");
  a.out = array<float>(info, 3, T * H, op, "out");
  a.T = T, a.H = H, a.I = I, a.K = K, a.E = E;
  a.act = static_cast<int>(act);
  a.alpha = static_cast<float>(number(info, 10, op, "alpha"));
  a.limit = static_cast<float>(number(info, 11, op, "limit"));
  const int32_t* kinds = array<int32_t>(info, 12, 3 * E, op, "kinds");
  if (info.Length() < 14 || !info[13].IsArray()) fail(env, op, "projections must be an Array");
  Napi::Array list = info[13].As<Napi::Array>();
  if (static_cast<int64_t>(list.Length()) != 3 * E) fail(env, op, "projections must hold 3 * E entries");
  a.proj.resize(static_cast<size_t>(3 * E));
  for (int64_t p = 0; p < 3 * E; ++p) {
    const std::string name = "projections[" + std::to_string(p) + "]";
    Napi::Value v = list.Get(static_cast<uint32_t>(p));
    if (!v.IsArray() || v.As<Napi::Array>().Length() != 4) fail(env, op, name + " must be [w, scales, rowSums, bias]");
    Napi::Array parts = v.As<Napi::Array>();
    const bool down = p % 3 == 2;
    const int64_t N = down ? H : I, Kd = down ? I : H;
    MoeProjection& pr = a.proj[p];
    const int kind = kinds[p];
    if (kind < 0 || kind >= 2 + kQuantSchemes) fail(env, op, name + ": kind must be 0 (f32), 1 (bf16) or 2 + a quant scheme");
    if (kind == 0) {
      pr.w = arrayOf<float>(env, parts.Get(0u), N * Kd, op, name + ".w");
    } else if (kind == 1) {
      pr.w = arrayOf<uint16_t>(env, parts.Get(0u), N * Kd, op, name + ".w");
    } else {
      const int64_t scheme = kind - 2;
      checkQuantScheme(info, op, scheme, Kd);
      pr.scheme = static_cast<int>(scheme);
      pr.w = arrayOf<uint8_t>(env, parts.Get(0u), quantDataBytes(scheme, N, Kd), op, name + ".w");
      const int64_t sb = quantScalesBytes(scheme, N, Kd);
      Napi::Value sv = parts.Get(1u);
      if (quantByteScales(scheme)) pr.scales = arrayOf<uint8_t>(env, sv, sb, op, name + ".scales");
      else if (quantHalfScales(scheme)) pr.scales = arrayOf<uint16_t>(env, sv, sb / 2, op, name + ".scales");
      else pr.scales = arrayOf<float>(env, sv, sb / 4, op, name + ".scales");
      if (scheme == kQuantInt8) pr.rowSums = arrayOf<int32_t>(env, parts.Get(2u), N, op, name + ".rowSums");
    }
    pr.kind = std::min(kind, 2);
    Napi::Value bias = parts.Get(3u);
    if (!bias.IsNull() && !bias.IsUndefined()) pr.bias = arrayOf<float>(env, bias, N, op, name + ".bias");
  }
  if (T == 0) return {op, nullptr};
  // the arguments are shared, never modified: a step graph may run the job again (stream.h's Job contract)
  return {op, [args] { moeForward(*args, *gK, *gQ); }};
}

// sortRows(x, values, indices, rows, n, descending): stable sort of each f32 row (topk; moe.h sortRows).
Job SortRows(const Napi::CallbackInfo& info) {
  const char* op = "sortRows";
  const int64_t rows = integer(info, 3, op, "rows"), n = integer(info, 4, op, "n");
  if (n > INT32_MAX) fail(info.Env(), op, "n must fit int32 indices");
  const float* x = array<float>(info, 0, rows * n, op, "x");
  float* values = array<float>(info, 1, rows * n, op, "values");
  int32_t* indices = array<int32_t>(info, 2, rows * n, op, "indices");
  const bool desc = boolean(info, 5);
  if (rows == 0 || n == 0) return {op, nullptr};
  return {op, [=] { sortRows(x, values, indices, rows, n, desc); }};
}

template <typename S, typename D, void (*KernelTable::*Fn)(const S*, D*, int64_t)>
Job Convert(const Napi::CallbackInfo& info) {
  const int64_t n = integer(info, 2, "convert", "n");
  const S* src = array<S>(info, 0, n, "convert", "src");
  D* dst = array<D>(info, 1, n, "convert", "dst");
  return {"convert", [=] { (gK->*Fn)(src, dst, n); }};
}

// ---------------------------------------------------------------- batched sampling (native/sampling.h)
// sampleRows(logits, rows, vocab, temperature, topK, topP, minP, uniform, out, stages = 3): per row, greedy
// argmax (temperature 0) or temperature -> min_p -> top-k/top-p -> draw, as src/engine/sampler.ts.
// temperature/topP/minP/uniform are Float64Array so 1/T, log(min_p) and top_p * total match the JS doubles.
template <>
struct ArrayKind<double> {
  static constexpr napi_typedarray_type type = napi_float64_array;
  static constexpr const char* name = "Float64Array";
};

Job SampleRows(const Napi::CallbackInfo& info) {
  const char* op = "sampleRows";
  SampleRowsArgs a{};
  a.rows = integer(info, 1, op, "rows");
  a.vocab = integer(info, 2, op, "vocab", 1);
  a.logits = array<float>(info, 0, a.rows * a.vocab, op, "logits");
  a.temperature = array<double>(info, 3, a.rows, op, "temperature");
  a.topK = array<int32_t>(info, 4, a.rows, op, "topK");
  a.topP = array<double>(info, 5, a.rows, op, "topP");
  a.minP = array<double>(info, 6, a.rows, op, "minP");
  a.uniform = array<double>(info, 7, a.rows, op, "uniform");
  a.out = array<int32_t>(info, 8, a.rows, op, "out");
  const int64_t stages = info.Length() > 9 && !info[9].IsUndefined() ? integer(info, 9, op, "stages", 1)
                                                                      : static_cast<int64_t>(kSampleAll);
  if (stages > kSampleAll) fail(info.Env(), op, "stages must be 1 (scale), 2 (draw) or 3 (both)");
  a.stages = static_cast<int>(stages);
  for (int64_t r = 0; r < a.rows; ++r) {
    const char* bad = nullptr;
    if (!(a.temperature[r] >= 0)) bad = "temperature must be >= 0";
    else if (a.topK[r] < 0) bad = "topK must be >= 0";
    else if (!(a.topP[r] > 0)) bad = "topP must be > 0";
    else if (!(a.minP[r] >= 0 && a.minP[r] <= 1)) bad = "minP must be in [0, 1]";
    else if (!(a.uniform[r] >= 0 && a.uniform[r] < 1)) bad = "uniform must be in [0, 1)";
    if (bad) fail(info.Env(), op, std::string(bad) + " (row " + std::to_string(r) + ")");
  }
  if (a.rows == 0) return {op, nullptr};
  return {op, [a] { sampleRows(a); }};
}
// ---------------------------------------------------------------- end batched sampling

// The same validation feeds both entry points: `k.matmul(...)` runs now (after draining the stream, to
// keep order), `k.stream.matmul(...)` enqueues and returns the job's sequence number.
using Prepare = Job (*)(const Napi::CallbackInfo&);
template <Prepare P>
Napi::Value RunNow(const Napi::CallbackInfo& info) {
  streamDrainForSyncCall(info.Env());  // first: validation may read index data a pending job writes
  Job job = P(info);
  if (job.run) job.run();
  return info.Env().Undefined();
}
template <Prepare P>
Napi::Value Submit(const Napi::CallbackInfo& info) {
  return streamSubmit(info.Env(), P(info));
}

// memoryReadBandwidth(buf | bufs, iterations, threads): GB/s reading one typed array, or an array of them in order.
Napi::Value MemoryReadBandwidth(const Napi::CallbackInfo& info) {
  const char* op = "memoryReadBandwidth";
  Napi::Env env = info.Env();
  std::vector<const void*> ranges;
  std::vector<int64_t> bytes;
  auto add = [&](Napi::Value v) {
    if (!v.IsTypedArray()) fail(env, op, "buf must be a typed array or an array of typed arrays");
    Napi::TypedArray ta = v.As<Napi::TypedArray>();
    ranges.push_back(static_cast<const uint8_t*>(ta.ArrayBuffer().Data()) + ta.ByteOffset());
    bytes.push_back(static_cast<int64_t>(ta.ByteLength()));
  };
  if (info.Length() > 0 && info[0].IsArray()) {
    Napi::Array list = info[0].As<Napi::Array>();
    for (uint32_t i = 0; i < list.Length(); ++i) add(list.Get(i));
  } else {
    add(info.Length() > 0 ? info[0] : env.Undefined());
  }
  const int64_t it = integer(info, 1, op, "iterations", 1), threads = integer(info, 2, op, "threads", 1);
  if (threads > 64) fail(env, op, "threads must be <= 64");
  return Napi::Number::New(env, gK->memoryReadBandwidth(ranges.data(), bytes.data(), static_cast<int>(ranges.size()),
                                                        static_cast<int>(it), static_cast<int>(threads)));
}

// coreRoundTrip(iterations): mean ns of a cache line's round trip between two pool threads (thread-pool.h
// poolRoundTripNs; 0 with one thread).
Napi::Value CoreRoundTrip(const Napi::CallbackInfo& info) {
  const int64_t it = integer(info, 0, "coreRoundTrip", "iterations", 1);
  if (it > (int64_t{1} << 30)) fail(info.Env(), "coreRoundTrip", "iterations must be <= 2^30");
  streamDrainForSyncCall(info.Env());  // the pool may be inside a stream job
  return Napi::Number::New(info.Env(), poolRoundTripNs(static_cast<int>(it)));
}

Napi::Value FmaPeak(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), gK->fmaPeak(integer(info, 0, "fmaPeak", "iterations", 1)));
}
// quantDotPeak(iterations, threads): measured VNNI vpdpbusd peak in GOP/s (0 on the portable quant table).
Napi::Value QuantDotPeak(const Napi::CallbackInfo& info) {
  const int64_t it = integer(info, 0, "quantDotPeak", "iterations", 1);
  const int64_t t = integer(info, 1, "quantDotPeak", "threads", 1);
  streamDrainForSyncCall(info.Env());  // the pool may be inside a stream job
  return Napi::Number::New(info.Env(), gQ->dotPeak(it, static_cast<int>(t > 256 ? 256 : t)));
}

// decodeTuning([{quantAhead?, gemvAhead?, prefetchIntoL1?, handOverMinBytes?}]): how decode products run (thread-pool.h
// DecodeTuning); the fields given are set (all checked before any is); returns the setting in force.
Napi::Value DecodeTuningFn(const Napi::CallbackInfo& info) {
  const char* op = "decodeTuning";
  Napi::Env env = info.Env();
  if (info.Length() > 0 && !info[0].IsUndefined()) {
    if (!info[0].IsObject() || info[0].IsArray())
      fail(env, op, "setting must be an object {quantAhead, gemvAhead, prefetchIntoL1, handOverMinBytes}");
    Napi::Object o = info[0].As<Napi::Object>();
    DecodeTuning next = gDecodeTuning;
    auto bytes = [&](const char* key, int64_t& field, double max, const char* range) {
      Napi::Value v = o.Get(key);
      if (v.IsUndefined()) return;
      const double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1;
      if (!(d >= 0 && d <= max && d == static_cast<double>(static_cast<int64_t>(d))))
        fail(env, op, std::string(key) + " must be an integer number of bytes in " + range);
      field = static_cast<int64_t>(d);
    };
    auto flag = [&](const char* key, bool& field) {
      Napi::Value v = o.Get(key);
      if (v.IsUndefined()) return;
      if (!v.IsBoolean()) fail(env, op, std::string(key) + " must be a boolean");
      field = v.As<Napi::Boolean>().Value();
    };
    bytes("quantAhead", next.quantAhead, 65536, "[0, 65536]");
    bytes("gemvAhead", next.gemvAhead, 65536, "[0, 65536]");
    flag("prefetchIntoL1", next.prefetchIntoL1);
    bytes("handOverMinBytes", next.handOverMinBytes, 9007199254740991.0, "[0, 2^53)");
    streamDrainForSyncCall(env);  // no kernel may run while it changes
    gDecodeTuning = next;
  }
  Napi::Object r = Napi::Object::New(env);
  r.Set("quantAhead", static_cast<double>(gDecodeTuning.quantAhead));
  r.Set("gemvAhead", static_cast<double>(gDecodeTuning.gemvAhead));
  r.Set("prefetchIntoL1", gDecodeTuning.prefetchIntoL1);
  r.Set("handOverMinBytes", static_cast<double>(gDecodeTuning.handOverMinBytes));
  return r;
}

Napi::Value SetNumThreads(const Napi::CallbackInfo& info) {
  const int64_t n = integer(info, 0, "setNumThreads", "n", 1);
  streamDrainForSyncCall(info.Env());  // the stream thread may be inside a pool job
  poolSetNumThreads(static_cast<int>(n > 256 ? 256 : n));
  return info.Env().Undefined();
}
Napi::Value GetNumThreads(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), poolGetNumThreads());
}

// mapFile(path, byteOffset, byteLength): the file range as an ArrayBuffer over a private (copy-on-write) memory
// map, llama.cpp's mmap loading: no read, no copy; the pages are the page cache's until someone writes one.
// The pages are faulted in read-only now (MAP_POPULATE on a read-only map) and the map then made writable, so a
// write copies just its page. Unmapped when the ArrayBuffer is garbage-collected.
struct Mapping {
  void* base;
  size_t span;
};
Napi::Value MapFile(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString()) fail(env, "mapFile", "path must be a string");
  const std::string path = info[0].As<Napi::String>().Utf8Value();
  const int64_t offset = integer(info, 1, "mapFile", "byteOffset", 0);
  const int64_t length = integer(info, 2, "mapFile", "byteLength", 1);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Napi::Error::New(env, "[mapFile] " + path + ": " + strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || offset + length > st.st_size) {
    close(fd);
    throw Napi::RangeError::New(env, "[mapFile] " + path + ": bytes [" + std::to_string(offset) + ", " +
                                         std::to_string(offset + length) + ") lie past the end of the file");
  }
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t start = offset / page * page;
  const size_t span = static_cast<size_t>(offset - start + length);
  void* base = mmap(nullptr, span, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, static_cast<off_t>(start));
  const int mapErr = errno;
  close(fd);
  if (base == MAP_FAILED) throw Napi::Error::New(env, "[mapFile] " + path + ": " + strerror(mapErr));
  if (mprotect(base, span, PROT_READ | PROT_WRITE) != 0) {
    const int protErr = errno;
    munmap(base, span);
    throw Napi::Error::New(env, "[mapFile] " + path + ": " + strerror(protErr));
  }
  auto* m = new Mapping{base, span};
  return Napi::ArrayBuffer::New(
      env, static_cast<uint8_t*>(base) + (offset - start), static_cast<size_t>(length),
      [](Napi::Env e, void*, Mapping* hint) {
        streamWaitIdle(e);  // a queued job may still read it (a terminated Worker's teardown)
        munmap(hint->base, hint->span);
        delete hint;
      },
      m);
}

// Huge-page host memory. Weights and KV caches are read in full every decode step; on 4 KiB pages each short matrix
// stream restarts the hardware prefetchers and the TLB at every page, on 2 MiB pages it does not. Buffers are carved
// (256-byte aligned, zero-filled) from 2 MiB-aligned anonymous chunks advised MADV_HUGEPAGE before first touch; a chunk
// is unmapped when every buffer carved from it has been collected and a newer chunk took its place.
struct HugeChunk {
  uint8_t* base;
  size_t size;
  size_t used;
  int64_t refs;  // live buffers, +1 while it is the chunk new buffers come from
};
constexpr size_t kHugePage = size_t(2) << 20, kHugeChunk = size_t(64) << 20, kHugeAlign = 256;
std::mutex gHugeMutex;
HugeChunk* gHugeCurrent = nullptr;

HugeChunk* mapHugeChunk(size_t size) {
  size = (size + kHugePage - 1) / kHugePage * kHugePage;
  void* raw = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t r = reinterpret_cast<uintptr_t>(raw), a = (r + kHugePage - 1) / kHugePage * kHugePage;
  if (a > r) munmap(raw, a - r);
  if (a + size < r + size + kHugePage) munmap(reinterpret_cast<void*>(a + size), r + size + kHugePage - (a + size));
#ifdef MADV_HUGEPAGE
  madvise(reinterpret_cast<void*>(a), size, MADV_HUGEPAGE);  // a refusal (THP off) leaves ordinary pages
#endif
  return new HugeChunk{reinterpret_cast<uint8_t*>(a), size, 0, 0};
}

void dropHugeRef(HugeChunk* c) {
  if (--c->refs > 0) return;
  munmap(c->base, c->size);
  delete c;
}

// Faults [p, p + bytes) in now, writable, without writing it (MADV_POPULATE_WRITE, Linux 5.14+; elsewhere the pages
// fault in at first touch). On this project's VMs, first writes into fresh anonymous memory cost ~12 us per 4 KiB
// page (512 MiB in 1.6 s) and 0.3-1.0 s per 512 MiB of huge pages, against 84 ms and 28-37 ms populated this way (a
// C loop writing one byte per 4 KiB page against one madvise over the range, fresh mappings of each kind).
// Memory the guest has never touched faults in far slower on these VMs (the host backs it at first touch): a 4 GiB
// KV cache took 8.7 s on one thread (0.46 GiB/s past the first ~0.5 GiB), so the range is cut into 32 MiB pieces
// that the pool's threads populate side by side (one byte written per 4 KiB page over 4 GiB: 15.2 s on one thread,
// 9.2 s on two).
void populate(uint8_t* p, size_t bytes) {
#if defined(__linux__)
  constexpr int kPopulateWrite = 23;  // MADV_POPULATE_WRITE, absent from older headers
  constexpr uintptr_t kPiece = uintptr_t(32) << 20;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(4095);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + bytes + 4095) & ~uintptr_t(4095);
  auto piece = [&](int64_t i) {
    const uintptr_t a = lo + static_cast<uintptr_t>(i) * kPiece, b = a + kPiece < hi ? a + kPiece : hi;
    madvise(reinterpret_cast<void*>(a), b - a, kPopulateWrite);  // a refusal (old kernel) leaves lazy faults
  };
  parallelChunks(static_cast<int64_t>((hi - lo + kPiece - 1) / kPiece), piece);
#else
  (void)p, (void)bytes;
#endif
}

// ggufRepack(type, src, N, K, data, scales): GGUF blocks of type (a ggml type id: Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL,
// IQ4_XS, MXFP4)
// of an [N, K] tensor -> quant.h's data and scale bytes (gguf-repack.h). Synchronous.
Napi::Value GgufRepack(const Napi::CallbackInfo& info) {
  const char* op = "ggufRepack";
  const int64_t type = integer(info, 0, op, "type"), N = integer(info, 2, op, "N"), K = integer(info, 3, op, "K");
  if (ggufBlockBytes(type) == 0) fail(info.Env(), op, "type must be a ggml type id of Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS or MXFP4");
  const int64_t elems = ggufBlockElems(type);
  // the 32-element 4-bit types pair their blocks into 64-element chunks: whole chunks per row
  const int64_t multiple = elems == 32 ? 64 : elems;
  if (K % multiple != 0)
    throw Napi::RangeError::New(info.Env(), "[ggufRepack] K must be a multiple of " + std::to_string(multiple) + ", got " + std::to_string(K));
  const int64_t blocks = N * K / elems;
  const uint8_t* src = array<uint8_t>(info, 1, blocks * ggufBlockBytes(type), op, "src");
  uint8_t* data = array<uint8_t>(info, 4, blocks * ggufDataBytes(type), op, "data");
  uint8_t* scales = array<uint8_t>(info, 5, blocks * ggufScaleBytes(type), op, "scales");
  ggufRepack(type, src, blocks, data, scales);
  return info.Env().Undefined();
}

// populate(arrayBuffer): faults its pages in now (populate above), for memory every step will write (a KV cache).
Napi::Value Populate(const Napi::CallbackInfo& info) {
  if (info.Length() < 1 || !info[0].IsArrayBuffer()) throw Napi::TypeError::New(info.Env(), "[populate] expected an ArrayBuffer");
  Napi::ArrayBuffer b = info[0].As<Napi::ArrayBuffer>();
  if (b.ByteLength() > 0) populate(static_cast<uint8_t*>(b.Data()), b.ByteLength());
  return info.Env().Undefined();
}

// allocHugeMemory(byteLength) -> ArrayBuffer of zeros on huge pages where the kernel grants them, faulted in. Its bytes count as
// V8 external memory (GC pressure), as those of an ordinary ArrayBuffer do.
Napi::Value AllocHugeMemory(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const int64_t n = integer(info, 0, "allocHugeMemory", "byteLength", 1);
  const size_t bytes = static_cast<size_t>(n), padded = (bytes + kHugeAlign - 1) / kHugeAlign * kHugeAlign;
  HugeChunk* chunk = nullptr;
  size_t at = 0;
  int err = 0;
  {
    std::lock_guard<std::mutex> g(gHugeMutex);
    if (padded > kHugeChunk / 2) {  // a big buffer gets a chunk of its own
      chunk = mapHugeChunk(padded);
    } else {
      if (!gHugeCurrent || gHugeCurrent->size - gHugeCurrent->used < padded) {
        HugeChunk* fresh = mapHugeChunk(kHugeChunk);
        if (fresh) {
          if (gHugeCurrent) dropHugeRef(gHugeCurrent);
          gHugeCurrent = fresh;
          fresh->refs = 1;
        }
      }
      if (gHugeCurrent && gHugeCurrent->size - gHugeCurrent->used >= padded) chunk = gHugeCurrent;
    }
    if (chunk) {
      at = chunk->used;
      chunk->used += padded;
      chunk->refs++;
    } else {
      err = errno;
    }
  }
  if (!chunk) throw Napi::Error::New(env, std::string("[allocHugeMemory] ") + strerror(err));
  populate(chunk->base + at, padded);
  struct Hint {
    HugeChunk* chunk;
    int64_t bytes;
  };
  auto* hint = new Hint{chunk, static_cast<int64_t>(bytes)};
  Napi::ArrayBuffer buffer;
  try {
    buffer = Napi::ArrayBuffer::New(
        env, chunk->base + at, bytes,
        [](Napi::Env e, void*, Hint* h) {
          streamWaitIdle(e);  // a queued job may still read it (a terminated Worker's teardown)
          Napi::MemoryManagement::AdjustExternalMemory(e, -h->bytes);
          {
            std::lock_guard<std::mutex> g(gHugeMutex);
            dropHugeRef(h->chunk);
          }
          delete h;
        },
        hint);
  } catch (...) {
    {
      std::lock_guard<std::mutex> g(gHugeMutex);
      dropHugeRef(chunk);
    }
    delete hint;
    throw;
  }
  Napi::MemoryManagement::AdjustExternalMemory(env, static_cast<int64_t>(bytes));
  return buffer;
}

Napi::Value FeaturesFn(const Napi::CallbackInfo& info) {
  Napi::Object o = Napi::Object::New(info.Env());
  o.Set("avx512f", kFeatures.avx512f);
  o.Set("avx512bf16", kFeatures.avx512bf16);
  o.Set("avx512vnni", kFeatures.avx512vnni);
  o.Set("avx2", kFeatures.avx2);
  o.Set("fma", kFeatures.fma);
  o.Set("amx", gQ->amx());  // large-M int8 (quant table) and bf16 (avx512-bf16 table) products run on AMX tiles
  return o;
}

// ---------------------------------------------------------------- compiled-program segments (src/compile)
// streamCallFn(address: bigint, buffers: (ArrayBuffer|TypedArray)[], byteOffsets?: BigInt64Array,
//              sizes?: BigInt64Array) -> sequence number
// Enqueues a call of generated code `void f(void** bufs, const int64_t* sizes)` (a kiln_jit entry's
// address; jit libraries are never dlclosed, so the code outlives the job). Pointers and sizes are copied
// into the job; the caller keeps the buffers alive and tracked until the stream has run it. Goes through
// streamSubmit, so a step-graph capture records it like any kernel.
typedef void (*JitEntry)(void** bufs, const int64_t* sizes);

Napi::Value StreamCallFn(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const char* op = "streamCallFn";
  if (info.Length() < 2 || !info[0].IsBigInt() || !info[1].IsArray()) fail(env, op, "expected (address: bigint, buffers: array, ...)");
  bool lossless = false;
  const uint64_t address = info[0].As<Napi::BigInt>().Uint64Value(&lossless);
  if (!lossless || address == 0) fail(env, op, "bad function address");
  const int64_t* offsets = nullptr;
  size_t numOffsets = 0;
  if (info.Length() > 2 && info[2].IsTypedArray()) {
    Napi::TypedArray ta = info[2].As<Napi::TypedArray>();
    if (ta.TypedArrayType() != napi_bigint64_array) fail(env, op, "byteOffsets must be a BigInt64Array");
    offsets = reinterpret_cast<const int64_t*>(static_cast<uint8_t*>(ta.ArrayBuffer().Data()) + ta.ByteOffset());
    numOffsets = ta.ElementLength();
  }
  Napi::Array arr = info[1].As<Napi::Array>();
  const uint32_t n = arr.Length();
  std::vector<void*> bufs(n);
  for (uint32_t i = 0; i < n; i++) {
    Napi::Value v = arr.Get(i);
    uint8_t* data;
    size_t len;
    if (v.IsTypedArray()) {
      Napi::TypedArray ta = v.As<Napi::TypedArray>();
      data = static_cast<uint8_t*>(ta.ArrayBuffer().Data()) + ta.ByteOffset();
      len = ta.ByteLength();
    } else if (v.IsArrayBuffer()) {
      Napi::ArrayBuffer ab = v.As<Napi::ArrayBuffer>();
      data = static_cast<uint8_t*>(ab.Data());
      len = ab.ByteLength();
    } else {
      fail(env, op, "buffers must be typed arrays or ArrayBuffers");
    }
    const int64_t off = i < numOffsets ? offsets[i] : 0;
    if (off < 0 || static_cast<size_t>(off) > len) fail(env, op, "byte offset " + std::to_string(off) + " outside buffer " + std::to_string(i));
    bufs[i] = data + off;
  }
  std::vector<int64_t> sizes;
  if (info.Length() > 3 && info[3].IsTypedArray()) {
    Napi::TypedArray ta = info[3].As<Napi::TypedArray>();
    if (ta.TypedArrayType() != napi_bigint64_array) fail(env, op, "sizes must be a BigInt64Array");
    const int64_t* s = reinterpret_cast<const int64_t*>(static_cast<uint8_t*>(ta.ArrayBuffer().Data()) + ta.ByteOffset());
    sizes.assign(s, s + ta.ElementLength());
  }
  JitEntry fn = reinterpret_cast<JitEntry>(static_cast<uintptr_t>(address));
  // re-runnable (step-graph replay): the captured pointer array is never modified, generated code only reads it
  return streamSubmit(env, {op, [fn, bufs = std::move(bufs), sizes = std::move(sizes)] {
                              fn(const_cast<void**>(bufs.data()), sizes.empty() ? nullptr : sizes.data());
                            }});
}
// ---------------------------------------------------------------- end compiled-program segments

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("isa", Napi::String::New(env, gK->name));
  exports.Set("quantIsa", Napi::String::New(env, gQ->name));
  exports.Set("bf16DotMinM", Napi::Number::New(env, static_cast<double>(gK->bf16DotMinM)));
  exports.Set("fp8DotMinM", Napi::Number::New(env, static_cast<double>(gK->fp8DotMinM)));
  exports.Set("features", Napi::Function::New(env, FeaturesFn, "features"));
  exports.Set("setNumThreads", Napi::Function::New(env, SetNumThreads, "setNumThreads"));
  exports.Set("decodeTuning", Napi::Function::New(env, DecodeTuningFn, "decodeTuning"));
  exports.Set("getNumThreads", Napi::Function::New(env, GetNumThreads, "getNumThreads"));
  exports.Set("mapFile", Napi::Function::New(env, MapFile, "mapFile"));
  exports.Set("allocHugeMemory", Napi::Function::New(env, AllocHugeMemory, "allocHugeMemory"));
  exports.Set("populate", Napi::Function::New(env, Populate, "populate"));
  exports.Set("ggufRepack", Napi::Function::New(env, GgufRepack, "ggufRepack"));
  struct Entry {
    const char* name;
    Napi::Function::Callback now, submit;
  };
  const Entry kernels[] = {
      {"matmul", RunNow<Matmul>, Submit<Matmul>},
      {"quantMatmul", RunNow<QuantMatmul>, Submit<QuantMatmul>},
      {"quantizeWeights", RunNow<QuantizeWeights>, Submit<QuantizeWeights>},
      {"unary", RunNow<Unary>, Submit<Unary>},
      {"binary", RunNow<Binary>, Submit<Binary>},
      {"siluMul", RunNow<SiluMul>, Submit<SiluMul>},
      {"siluMulQuant", RunNow<SiluMulQuant>, Submit<SiluMulQuant>},
      {"rmsNorm", RunNow<RmsNorm>, Submit<RmsNorm>},
      {"rmsNormQuant", RunNow<RmsNormQuant>, Submit<RmsNormQuant>},
      {"addRmsNorm", RunNow<AddRmsNorm>, Submit<AddRmsNorm>},
      {"quantEmbedding", RunNow<QuantEmbedding>, Submit<QuantEmbedding>},
      {"indexAddRows", RunNow<IndexAddRows>, Submit<IndexAddRows>},
      {"softmax", RunNow<Softmax>, Submit<Softmax>},
      {"reduce", RunNow<Reduce>, Submit<Reduce>},
      {"argmax", RunNow<Argmax>, Submit<Argmax>},
      {"rotary", RunNow<Rotary>, Submit<Rotary>},
      {"pagedAttention", RunNow<PagedAttention>, Submit<PagedAttention>},
      {"flashAttention", RunNow<FlashAttention>, Submit<FlashAttention>},
      {"flashAttentionBackward", RunNow<FlashAttentionBackward>, Submit<FlashAttentionBackward>},
      {"embedding", RunNow<Embedding>, Submit<Embedding>},
      {"loraApply", RunNow<LoraApply>, Submit<LoraApply>},
      {"moe", RunNow<Moe>, Submit<Moe>},
      {"sortRows", RunNow<SortRows>, Submit<SortRows>},
      {"f32ToBf16", RunNow<Convert<float, uint16_t, &KernelTable::f32ToBf16>>,
       Submit<Convert<float, uint16_t, &KernelTable::f32ToBf16>>},
      {"bf16ToF32", RunNow<Convert<uint16_t, float, &KernelTable::bf16ToF32>>,
       Submit<Convert<uint16_t, float, &KernelTable::bf16ToF32>>},
      {"f16ToF32", RunNow<Convert<uint16_t, float, &KernelTable::f16ToF32>>,
       Submit<Convert<uint16_t, float, &KernelTable::f16ToF32>>},
      {"f32ToF16", RunNow<Convert<float, uint16_t, &KernelTable::f32ToF16>>,
       Submit<Convert<float, uint16_t, &KernelTable::f32ToF16>>},
      {"copyStrided", RunNow<CopyStrided>, Submit<CopyStrided>},
      {"copyPieces", RunNow<CopyPieces>, Submit<CopyPieces>},
      {"binaryStrided", RunNow<BinaryStrided>, Submit<BinaryStrided>},
      {"compareStrided", RunNow<CompareStrided>, Submit<CompareStrided>},
      {"whereStrided", RunNow<WhereStrided>, Submit<WhereStrided>},
  };
  Napi::Object stream = Napi::Object::New(env);
  for (const Entry& e : kernels) {
    exports.Set(e.name, Napi::Function::New(env, e.now, e.name));
    stream.Set(e.name, Napi::Function::New(env, e.submit, e.name));
  }
  exports.Set("stream", stream);
  addStreamExports(env, exports);
  exports.Set("memoryReadBandwidth", Napi::Function::New(env, MemoryReadBandwidth, "memoryReadBandwidth"));
  exports.Set("fmaPeak", Napi::Function::New(env, FmaPeak, "fmaPeak"));
  exports.Set("coreRoundTrip", Napi::Function::New(env, CoreRoundTrip, "coreRoundTrip"));
  exports.Set("quantDotPeak", Napi::Function::New(env, QuantDotPeak, "quantDotPeak"));
  exports.Set("sampleRows", Napi::Function::New(env, RunNow<SampleRows>, "sampleRows"));  // batched sampling
  exports.Set("streamCallFn", Napi::Function::New(env, StreamCallFn, "streamCallFn"));  // compiled programs
  return exports;
}

}  // namespace
}  // namespace kiln

static Napi::Object InitKiln(Napi::Env env, Napi::Object exports) { return kiln::Init(env, exports); }
NODE_API_MODULE(kiln_native, InitKiln)
