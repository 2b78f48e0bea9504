// Weight-only quantized matmul kernels (out = x @ W^T with W quantized, x f32), one table per ISA:
// quant-impl.inc compiled by quant-scalar.cc (portable loops), quant-avx2.cc (AVX2 + FMA + F16C) and quant-avx512.cc
// (AVX-512 BW + VNNI).
// addon.cc picks the table at run time. Layouts (W is nn.Linear's [N, K]):
//   int8: data int8 [N][K], scales f32 [N] (w = q * scale), rowSums int32 [N] = sum_k q[n][k].
//   int4: data uint8 [N][K/2]; each 64-element chunk c of a row is 32 bytes, byte j holding
//         element 64c+j in its low nibble and 64c+32+j in its high nibble, as q+8 (q in [-8, 7]);
//         scales f16 [N][K/32] (one per group of 32). K must be a multiple of 64.
//   fp8:  data e4m3fn [N][K], scales f32 [N].
//   int8 group-32 (GGUF Q8_0's blocks, scales and codes side by side): data int8 [N][K], scales f16 [N][K/32]
//         (w = q * scale of its group of 32). K must be a multiple of 64.
//   q4_k (GGUF Q4_K super-blocks of 256, repacked without dequantizing): data uint8 [N][K/2] with the nibble layout
//         of int4 (Q4_K's own qs order: byte j of chunk c holds elements 64c+j and 64c+32+j) but unsigned codes
//         q in [0, 15]; scales = meta uint8 [N][K/256][20]: f16 d, f16 dmin, u8 sc[8], u8 m[8] (6-bit sub-block
//         scales and mins, unpacked from Q4_K's 12 bytes). Element i of super-block b, sub-block j = (i % 256) / 32:
//         w = d * sc[j] * q - dmin * m[j]. ~4.6 bits per weight. K must be a multiple of 256.
//   q5_k (GGUF Q5_K super-blocks of 256, repacked without dequantizing): data uint8 [N][K/256][160] = each
//         super-block's qs[128] (q4_k's nibble order) and then its qh[32] (bit 2c of qh[l] is the fifth bit of
//         element 64c + l, bit 2c + 1 that of 64c + 32 + l), codes q in [0, 31]; scales = q4_k's meta bytes
//         [N][K/256][20]. w = d * sc[j] * q - dmin * m[j]. ~5.6 bits per weight. K must be a multiple of 256.
//   q6_k (GGUF Q6_K super-blocks of 256, kept as they are): data uint8 [N][K/256][192] = each super-block's ql[128]
//         and qh[64] as GGUF stores them (in half h = elements 128h..128h+127: ql byte 64h + p holds element 128h + p
//         in its low nibble and 128h + 64 + p in its high one, qh byte 32h + l bits 2t..2t+1 the top bits of element
//         128h + 32t + l), codes q in [0, 63]; scales = meta uint8 [N][K/256][18]: f16 d, int8 sc[16] (one per
//         sub-block of 16). w = d * sc[e / 16] * (q - 32). 6.56 bits per weight. K must be a multiple of 256.
//   mxfp4 (OCP Microscaling MXFP4; kernels in quant-mxfp4.inc): data uint8 [N][K/2] in int4's nibble order (chunk
//         c of 64: byte j holds element 64c+j low, 64c+32+j high), each nibble an E2M1 code (bit 3 sign, bits 2..1
//         exponent, bit 0 mantissa: 0, 0.5, 1, 1.5, 2, 3, 4, 6); scales uint8 [N][K/32], E8M0 (2^(e-127)), one per
//         group of 32: w = e2m1 * 2^(e-127), 4.25 bits per weight. K must be a multiple of 64.
//   iq4_nl (GGUF IQ4_NL blocks; kernels: quant-mxfp4.inc's, on another value table): data as mxfp4's, each nibble
//         an index into ggml's 16 non-linear int8 values (kvalues_iq4nl, -127 .. 113); scales f16 [N][K/32], as
//         int4's: w = value * scale, 4.5 bits per weight. K must be a multiple of 64.
#pragma once
#include <cstdint>

#include "kernels.h"

namespace kiln {

enum QuantScheme { kQuantInt8 = 0, kQuantInt4 = 1, kQuantFp8 = 2, kQuantInt8G32 = 3, kQuantQ4K = 4, kQuantMxfp4 = 5, kQuantQ6K = 6, kQuantQ5K = 7,
                   kQuantIq4Nl = 8, kQuantSchemes = 9 /* codes are 0 .. kQuantSchemes - 1 */ };

struct QuantMatmulArgs {
  const float* x;          // [M, K] f32
  const void* w;           // see the layouts above
  const void* scales;      // f32 [N] (int8, fp8), f16 [N][K/32] (int4, int8 group-32, iq4_nl), q4_k's / q6_k's meta bytes or e8m0 [N][K/32] (mxfp4)
  const int32_t* rowSums;  // int8 only: [N]
  float* out;              // [M, N]
  int64_t M, N, K;
  int scheme;
  // Optional pre-quantized x (int8/int4/int8 group-32/mxfp4; fp8 ignores it): xq int8 [M, K] and xs f32 [M], as
  // quantizeRows() writes them; the kernel then reads these instead of quantizing x (same bits either way).
  const int8_t* xq;
  const float* xs;
};

struct QuantTable {
  const char* name;
  void (*matmul)(const QuantMatmulArgs&);
  // Several M = 1 products of one x (vLLM's merged q/k/v and gate/up projections, without merging the weights):
  // as[0..n) share x, xq, xs, K and scheme, each computed exactly as matmul(as[i]),
  // in one parallel job whose threads split the rows of all n weights together (quantGroupable() says which).
  void (*matmulGroup)(const QuantMatmulArgs* as, int n);
  // Quantizes an f32 [N, K] weight into data/scales(/rowSums for int8) in the layout of `scheme`.
  void (*quantize)(int scheme, const float* w, int64_t N, int64_t K, void* data, void* scales, int32_t* rowSums);
  // Per-row symmetric int8 quantization of activations, as quant matmul does it: xs[m] = amax/127, xq = round(x / xs).
  void (*quantizeRows)(const float* x, int64_t M, int64_t K, int8_t* xq, float* xs);
  // out [K] = row `row` of a weight of K columns in `scheme`'s layout, dequantized (a quantized embedding's lookup):
  // each element exactly the f32 value the products read (w = q * scale, q4_k's d * sc * q - dmin * m). The caller
  // checks that the row exists.
  void (*dequantRow)(int scheme, const void* w, const void* scales, int64_t row, int64_t K, float* out);
  // Measured vpdpbusd (u8 x s8 -> s32) peak of `threads` pool threads in GOP/s (2 ops per product); 0 without VNNI.
  double (*dotPeak)(int64_t iterations, int threads);
  // Whether large-M int8 and int8 group-32 products run on AMX tiles (amx.h amxReady: the CPU has AMX, the OS
  // enables it and KILN_AMX is not 0), else on the VNNI tiles.
  bool (*amx)();
};

// The k-quants (GGUF super-blocks of 256: q4_k, q5_k, q6_k): K a multiple of 256, no native quantizer.
inline bool quantSuperBlocks(int64_t scheme) {
  return scheme == kQuantQ4K || scheme == kQuantQ5K || scheme == kQuantQ6K;
}
// Schemes whose scales are bytes (the k-quants' meta, mxfp4's e8m0) rather than f16 or f32.
inline bool quantByteScales(int64_t scheme) { return scheme == kQuantMxfp4 || quantSuperBlocks(scheme); }

// Schemes whose scales are f16, one per group of 32.
inline bool quantHalfScales(int64_t scheme) {
  return scheme == kQuantInt4 || scheme == kQuantInt8G32 || scheme == kQuantIq4Nl;
}

/** Whether matmulGroup takes `a` (with others of the same x, K and scheme). */
inline bool quantGroupable(const QuantMatmulArgs& a) {
  return a.M == 1;
}

// Weight bytes of an [N, K] weight: 4-bit codes for int4, q4_k, mxfp4 and iq4_nl, 5- and 6-bit for q5_k and q6_k, a byte each
// otherwise.
inline int64_t quantDataBytes(int64_t scheme, int64_t N, int64_t K) {
  if (scheme == kQuantQ6K) return N * K / 256 * 192;
  if (scheme == kQuantQ5K) return N * K / 256 * 160;
  return scheme == kQuantInt4 || scheme == kQuantQ4K || scheme == kQuantMxfp4 || scheme == kQuantIq4Nl ? N * K / 2 : N * K;
}
// Scale bytes of an [N, K] weight in `scheme`'s layout (above): e8m0 bytes per 32 (mxfp4), q6_k's 18 and q4_k's / q5_k's 20 meta bytes per
// 256, f16 per 32 (int4, int8 group-32, iq4_nl) or f32 per row (int8, fp8). int8's row sums are 4 bytes per row more.
inline int64_t quantScalesBytes(int64_t scheme, int64_t N, int64_t K) {
  if (scheme == kQuantMxfp4) return N * K / 32;
  if (scheme == kQuantQ4K || scheme == kQuantQ5K) return N * K / 256 * 20;
  if (scheme == kQuantQ6K) return N * K / 256 * 18;
  if (quantHalfScales(scheme)) return N * K / 32 * 2;
  return N * 4;
}

// A quantized product on `qt`, or, for fp8 at M >= kt.fp8DotMinM, on kt's vdpbf16ps tiles (KernelTable::gemmFp8: x
// rounded to bf16, as bf16 weights' products of that many rows are).
inline void runQuantMatmul(const QuantTable& qt, const KernelTable& kt, const QuantMatmulArgs& a) {
  if (a.scheme == kQuantFp8 && kt.fp8DotMinM > 0 && a.M >= kt.fp8DotMinM)
    return kt.gemmFp8(a.x, static_cast<const uint8_t*>(a.w), static_cast<const float*>(a.scales), a.out, a.M, a.N, a.K);
  qt.matmul(a);
}

extern const QuantTable kQuantScalar;
#if defined(__x86_64__)
extern const QuantTable kQuantAvx512;
extern const QuantTable kQuantAvx2;
#endif

}  // namespace kiln
