// Intel AMX (Advanced Matrix Extensions) helpers shared by the int8 (quant-amx.inc) and bf16 (gemm-bf16-amx.inc)
// tile kernels: whether the tiles may be used here, their configuration, and the weight repacking both share. Included
// only by translation units compiled with -mamx-tile (and AVX-512), whose AMX code runs only where amxReady() holds.
#pragma once
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace kiln {

// Whether this CPU has AMX-TILE, AMX-INT8 and AMX-BF16 enabled by the OS (XCR0's tile bits) and this process may use
// the tile data state (Linux's arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, asked once; process-wide).
// KILN_AMX=0 turns the AMX kernels off (the VNNI / AVX512-BF16 ones run instead).
inline bool amxReady() {
  static const bool ok = [] {
    const char* env = std::getenv("KILN_AMX");
    if (env != nullptr && env[0] == '0') return false;
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!(d & (1u << 24)) || !(d & (1u << 25)) || !(d & (1u << 22))) return false;  // AMX-TILE, -INT8, -BF16
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

// LDTILECFG's 64-byte operand (palette 1): bytes per row and rows of each of the 8 tiles.
struct alignas(64) AmxConfig {
  uint8_t palette = 1, startRow = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// dst (8 rows of 64 bytes) = the 32 bytes at w + kOff of 16 weight rows (rowBytes apart) in the B operand's layout:
// row j holds dword j of each weight row, weight row n at bytes 4n (for int8, 4 consecutive k; for bf16, a pair).
// Rows from nValid on are zero. Always inlined: GCC kept it out of line (called through the shared library's PLT, 35%
// of a bf16 M = 8 product's samples inside it); inlined, such products ran 1.1-1.2x faster.
__attribute__((always_inline)) inline void amxPackB32(const void* wv, int64_t rowBytes, int64_t nValid, int64_t kOff,
                                                      void* dstv) {
  const uint8_t* w = static_cast<const uint8_t*>(wv);
  uint8_t* dst = static_cast<uint8_t*>(dstv);
  if (nValid < 16) {
    for (int j = 0; j < 8; ++j)
      for (int n = 0; n < 16; ++n) {
        int32_t v = 0;
        if (n < nValid) memcpy(&v, w + n * rowBytes + kOff + 4 * j, 4);
        memcpy(dst + j * 64 + n * 4, &v, 4);
      }
    return;
  }
  // z[p] = weight rows p (low 256 bits) and p + 8 (high); then an 8 x 8 dword transpose within each half
  __m512i z[8];
  for (int p = 0; p < 8; ++p)
    z[p] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + p * rowBytes + kOff))),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (p + 8) * rowBytes + kOff)), 1);
  __m512i t[8], u[8];
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = _mm512_unpacklo_epi32(z[2 * p], z[2 * p + 1]);
    t[2 * p + 1] = _mm512_unpackhi_epi32(z[2 * p], z[2 * p + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 0-3 (8-11) into u[0..3], rows 4-7 (12-15) into u[4..7]
    const __m512i* th = t + 4 * h;
    u[4 * h + 0] = _mm512_unpacklo_epi64(th[0], th[2]);  // dwords 0 | 4 of four rows
    u[4 * h + 1] = _mm512_unpackhi_epi64(th[0], th[2]);  // 1 | 5
    u[4 * h + 2] = _mm512_unpacklo_epi64(th[1], th[3]);  // 2 | 6
    u[4 * h + 3] = _mm512_unpackhi_epi64(th[1], th[3]);  // 3 | 7
  }
  const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  for (int k = 0; k < 4; ++k) {
    _mm512_storeu_si512(dst + k * 64, _mm512_permutex2var_epi64(u[k], lo, u[k + 4]));
    _mm512_storeu_si512(dst + (k + 4) * 64, _mm512_permutex2var_epi64(u[k], hi, u[k + 4]));
  }
}

}  // namespace kiln
