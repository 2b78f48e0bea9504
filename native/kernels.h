// Kernel table: one instance per ISA (scalar / AVX2+FMA / AVX-512 / AVX-512+BF16), all compiled from
// kernels-impl.inc with different compiler flags and chosen at run time (see addon.cc).
#pragma once
#include <cstdint>

namespace kiln {

struct MatmulArgs {
  const float* a;       // [batch][M,K] f32, or [batch][K,M] when aTransposed
  const void* b;        // bTransposed ? [N,K] : [K,N]; f32 or bf16 (uint16)
  float* out;           // [batch][M,N]
  int64_t M, N, K;
  bool bTransposed;
  bool aTransposed;     // out = A^T @ B with A stored [K,M] row-major
  int bDtype;           // 0 f32, 1 bf16
  int64_t batch, strideA, strideB, strideOut;  // elements per batch item (0 = broadcast)
};

struct PagedAttentionArgs {
  const float* q;        // [T, Hq, D]
  const float* kNew;     // [T, Hkv, D]
  const float* vNew;     // [T, Hkv, D]
  void* kCache;          // [numBlocks, blockSize, Hkv, D] float, or bf16 bits when cacheBf16, or fp8 bytes (cacheFp8)
  void* vCache;
  bool cacheBf16;
  int cacheFp8;          // 0: none; 1: fp8 e4m3fn bytes, 2: fp8 e5m2 bytes (vLLM's --kv-cache-dtype fp8_e4m3 / fp8_e5m2)
  const int32_t* slotMapping;  // [T]
  const int32_t* blockTables;  // [numSeqs, maxBlocksPerSeq]
  const int32_t* queryStart;   // [numSeqs + 1]
  const int32_t* seqLens;      // [numSeqs]
  float* out;                  // [T, Hq, D]
  int64_t numSeqs, Hq, Hkv, D, blockSize, maxBlocksPerSeq;
  float scale;
  int64_t slidingWindow;
  // Attention logit soft-capping (Gemma 2's attn_logit_softcapping): each scaled score s becomes
  // softcap * tanh(s / softcap) before the causal / window mask and the softmax; 0 = none.
  float softcap;
  // Attention sinks (gpt-oss): one learned logit per query head [Hq] that joins each row's softmax denominator
  // as exp(sink - max); its value row is zero, so it only scales the output down. nullptr = none.
  const float* sinks;
  // Optional fused rotary (rotaryDim > 0): q and the new k rows are rotated at `positions` [T] with cos/sin
  // [maxPos, rotaryDim/2] (neox pairs (i, i+rd/2), else (2i, 2i+1)) before the cache write and the attention.
  const int32_t* positions;
  const float* cosT;
  const float* sinT;
  int64_t rotaryDim;
  bool neox;
  // Every query row of a sequence attends as its last position does: all its keys (an encoder's full attention, e.g.
  // a vision tower's patches as one sequence), or the last slidingWindow of them. false: causal, row t of a sequence
  // sees positions <= its own.
  bool bidirectional;
};

// Dense attention of training and whole-sequence forwards without the [S, Sk] scores (flash-attention-impl.inc):
// q [B, Hq, S, D], k and v [B, Hkv, Sk, D] (GQA: query head h reads KV head h / (Hq / Hkv)), all contiguous f32,
// Sk >= S with the queries aligned to the last S keys: query i (position i + Sk - S) sees keys j <= its position,
// narrowed by a sliding window (p - window < j) and by documents (docs[b * S + j] == docs[b * S + i]; S == Sk), widened
// by bidirectional spans [a, e) (a position in a span sees all of it). Scores are scale * q.k, soft-capped when
// softcap > 0. The forward writes out [B, Hq, S, D] and each row's log-sum-exp lse [B, Hq, S]; the backward reads
// q, k, v, o (= out), dout and lse and writes dq, dk, dv (overwritten, not accumulated).
struct FlashAttentionArgs {
  const float* q;
  const float* k;
  const float* v;
  int64_t B, Hq, Hkv, S, Sk, D;
  float scale;
  float softcap;          // 0: none
  int64_t window;         // 0: none
  const int32_t* docs;    // [B * S] or nullptr
  const int32_t* spans;   // nSpans pairs [a, e)
  int64_t nSpans;
  float* out;             // forward
  float* lse;             // forward: written; backward: read
  const float* o;         // backward
  const float* dout;
  float* dq;
  float* dk;
  float* dv;
  // Attention sinks (gpt-oss): one logit per query head [Hq] joined to every row's softmax denominator (its value row
  // zero); nullptr = none. The backward then writes their gradient to dsinks [Hq].
  const float* sinks;
  float* dsinks;
};

/** Whether gemvGroup takes `a` (with others of the same a, K and bDtype). */
inline bool gemvGroupable(const MatmulArgs& a) {
  return a.M == 1 && a.batch == 1 && a.bTransposed && !a.aTransposed && a.K > 0;
}

struct KernelTable {
  const char* name;
  void (*matmul)(const MatmulArgs&);
  // Several M = 1 products x @ W_i^T of one x (vLLM's merged q/k/v and gate/up projections, without merging the
  // weights): as[0..n) share a, K and bDtype, all bTransposed, batch 1 (gemvGroupable()), each computed exactly as
  // matmul(as[i]), in one parallel job whose threads split the rows of all n weights together.
  void (*gemvGroup)(const MatmulArgs* as, int n);
  void (*unary)(int op, const float* x, float* out, int64_t n);
  void (*binary)(int op, const float* a, const float* b, float* out, int64_t n, int64_t bn);
  void (*siluMul)(const float* gate, const float* up, float* out, int64_t n);
  void (*rmsNorm)(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps);
  // vLLM's fused_add_rms_norm: sum = x + r (rounded to f32, as a separate add), out = rmsNorm(sum); [rows, n] each,
  // bit for bit the separate kernels' results
  void (*addRmsNorm)(const float* x, const float* r, const float* w, float* sum, float* out, int64_t rows, int64_t n,
                     float eps);
  void (*softmax)(const float* x, float* out, int64_t rows, int64_t n, bool log);
  void (*reduce)(int op, const float* x, float* out, int64_t rows, int64_t n);
  void (*argmax)(const float* x, int32_t* out, int64_t rows, int64_t n);
  void (*rotary)(const float* x, const int32_t* pos, const float* cos, const float* sin, float* out,
                 int64_t T, int64_t H, int64_t D, int64_t rotaryDim, bool neox);
  void (*pagedAttention)(const PagedAttentionArgs&);
  void (*flashAttention)(const FlashAttentionArgs&);
  void (*flashAttentionBackward)(const FlashAttentionArgs&);
  void (*embedding)(const void* table, int dtype, const int32_t* ids, float* out, int64_t numIds,
                    int64_t dim);
  // Multi-LoRA (BGMV): out[t] = base[t] + scales[s] * B_s^T (A_s x[t]), s = slots[t]; a slot outside [0, S) adds
  // nothing (out may be base). base/out [T,N], x [T,K], a [S,R,K], b [S,R,N] (lora_B transposed), scales [S].
  void (*loraApply)(const float* base, const float* x, const float* a, const float* b, const float* scales,
                    const int32_t* slots, float* out, int64_t T, int64_t N, int64_t K, int64_t R, int64_t S);
  void (*f32ToBf16)(const float* src, uint16_t* dst, int64_t n);
  void (*bf16ToF32)(const uint16_t* src, float* dst, int64_t n);
  void (*f16ToF32)(const uint16_t* src, float* dst, int64_t n);
  void (*f32ToF16)(const float* src, uint16_t* dst, int64_t n);
  // Strided kernels: shapes coalesced by addon.cc (rank 1..8, no size-1 dims), strides in
  // elements >= 0; the stride arrays may be permuted in place. out of binary/where is contiguous.
  void (*copyStrided)(const void* src, void* dst, int rank, int64_t* shape, int64_t* srcStrides,
                      int64_t* dstStrides, int elemBytes);
  void (*binaryStrided)(int op, const float* a, int64_t* aStrides, const float* b, int64_t* bStrides,
                        float* out, int rank, const int64_t* shape);
  // out = a op b as bytes 0/1 (op: 0 ==, 1 !=, 2 <, 3 <=, 4 >, 5 >=; IEEE: NaN compares false but !=), strided as
  // binaryStrided
  void (*compareStrided)(int op, const float* a, int64_t* aStrides, const float* b, int64_t* bStrides, uint8_t* out,
                         int rank, const int64_t* shape);
  void (*whereStrided)(const uint8_t* cond, int64_t* condStrides, const float* a, int64_t* aStrides,
                       const float* b, int64_t* bStrides, float* out, int rank, const int64_t* shape);
  double (*memoryReadBandwidth)(const void* const* ranges, const int64_t* bytes, int n, int iterations, int threads);
  double (*fmaPeak)(int64_t iterations);
  // bf16 products with B = [N,K] (not batched-transposed A) and M >= this round a to bf16 and use
  // vdpbf16ps or AMX tiles (see gemm-bf16-impl.inc; 24, or 8 where AMX runs); 0: every bf16 product is exact f32.
  int64_t bf16DotMinM;
  // fp8 e4m3fn weights (quant.h's layout: codes [N,K], f32 scales [N]) at M >= fp8DotMinM: out = bf16(a) @ W^T * scales
  // on the vdpbf16ps tiles (gemm-bf16-impl.inc); runQuantMatmul (quant.h) routes them here. fp8DotMinM 0 (and gemmFp8
  // nullptr): none.
  void (*gemmFp8)(const float* a, const uint8_t* w, const float* scales, float* out, int64_t M, int64_t N, int64_t K);
  int64_t fp8DotMinM;
};

extern const KernelTable kScalarKernels;
#if defined(__x86_64__)
extern const KernelTable kAvx2Kernels;
extern const KernelTable kAvx512Kernels;
extern const KernelTable kAvx512Bf16Kernels;  // + AVX512-BF16 (vdpbf16ps) large-M bf16 GEMM
#endif

}  // namespace kiln
