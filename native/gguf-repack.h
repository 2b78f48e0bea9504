// GGUF quantized blocks -> the quant_matmul layouts of quant.h, moving bits only (the TS twins and the byte layouts
// are in src/models/formats/gguf-repack.ts, which the tests hold these to bit for bit). A loader's hot loop: a
// Llama-3-8B Q4_K file is 17.6M super-blocks. Included by addon.cc.
#pragma once
#include <cstdint>
#include <cstring>

#include "half.h"
#include "thread-pool.h"

namespace kiln {

// GGUF (ggml) type ids this repacks.
enum GgufBlockType { kGgufQ4_0 = 2, kGgufQ8_0 = 8, kGgufQ4_K = 12, kGgufQ5_K = 13, kGgufQ6_K = 14, kGgufIq4Nl = 20, kGgufIq4Xs = 23, kGgufMxfp4 = 39 };

// Source bytes per block and elements per block of a type this repacks (0 for others).
inline int64_t ggufBlockBytes(int64_t type) {
  switch (type) {
    case kGgufQ4_0: case kGgufIq4Nl: return 18;
    case kGgufQ8_0: return 34;
    case kGgufMxfp4: return 17;
    case kGgufQ4_K: return 144;
    case kGgufQ5_K: return 176;
    case kGgufQ6_K: return 210;
    case kGgufIq4Xs: return 136;
    default: return 0;
  }
}
inline int64_t ggufBlockElems(int64_t type) {
  return type == kGgufQ4_K || type == kGgufQ5_K || type == kGgufQ6_K || type == kGgufIq4Xs ? 256 : 32;
}
// Destination data and scale bytes per source block.
inline int64_t ggufDataBytes(int64_t type) {
  switch (type) {
    case kGgufQ8_0: return 32;
    case kGgufQ4_0: case kGgufIq4Nl: case kGgufMxfp4: return 16;
    case kGgufQ4_K: case kGgufIq4Xs: return 128;
    case kGgufQ5_K: return 160;
    case kGgufQ6_K: return 192;
    default: return 0;
  }
}
inline int64_t ggufScaleBytes(int64_t type) {
  switch (type) {
    case kGgufQ8_0: case kGgufQ4_0: case kGgufIq4Nl: return 2;
    case kGgufMxfp4: return 1;
    case kGgufQ4_K: case kGgufQ5_K: return 20;
    case kGgufQ6_K: return 18;
    case kGgufIq4Xs: return 16;  // eight f16 scales
    default: return 0;
  }
}

// Two consecutive 4-bit blocks' qs (16 bytes each, Q4_0 / IQ4_NL / MXFP4 order: element j < 16 low nibble of qs[j], else high
// of qs[j - 16]) -> one 64-element chunk of 32 bytes (byte j: element j low, 32 + j high).
inline void chunkFromBlocks(const uint8_t* a, const uint8_t* b, uint8_t* o) {
  for (int j = 0; j < 16; ++j) {
    o[j] = static_cast<uint8_t>((a[j] & 15) | ((b[j] & 15) << 4));     // elements j and 32 + j
    o[16 + j] = static_cast<uint8_t>((a[j] >> 4) | (b[j] & 0xf0));     // elements 16 + j and 48 + j
  }
}

// Q4_K / Q5_K's 12 packed scale bytes (ggml's get_scale_min_k4) -> sc[8] then m[8].
inline void unpackScaleMins(const uint8_t* p, uint8_t* out) {
  for (int j = 0; j < 4; ++j) {
    out[j] = p[j] & 63;
    out[8 + j] = p[j + 4] & 63;
    out[4 + j] = static_cast<uint8_t>((p[j + 8] & 15) | ((p[j] >> 6) << 4));
    out[12 + j] = static_cast<uint8_t>((p[j + 8] >> 4) | ((p[j + 4] >> 6) << 4));
  }
}

// Blocks [b0, b1) of `type` (b0 even for the 32-element 4-bit types, whose chunks take block pairs).
inline void ggufRepackBlocks(int64_t type, const uint8_t* src, int64_t b0, int64_t b1, uint8_t* data, uint8_t* scales) {
  const int64_t sb = ggufBlockBytes(type), db = ggufDataBytes(type), cb = ggufScaleBytes(type);
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* s = src + b * sb;
    uint8_t* d = data + b * db;
    uint8_t* c = scales + b * cb;
    switch (type) {
      case kGgufQ8_0: memcpy(c, s, 2), memcpy(d, s + 2, 32); break;
      case kGgufQ4_0:
      case kGgufIq4Nl:  // the same block: f16 d, then 16 bytes of codes (indices into kvalues_iq4nl)
        memcpy(c, s, 2);
        if (b % 2 == 1) chunkFromBlocks(s - 18 + 2, s + 2, data + (b - 1) * 16);
        break;
      case kGgufMxfp4:
        c[0] = s[0];
        if (b % 2 == 1) chunkFromBlocks(s - 17 + 1, s + 1, data + (b - 1) * 16);
        break;
      case kGgufQ4_K: memcpy(c, s, 4), unpackScaleMins(s + 4, c + 4), memcpy(d, s + 16, 128); break;
      case kGgufQ5_K: memcpy(c, s, 4), unpackScaleMins(s + 4, c + 4), memcpy(d, s + 48, 128), memcpy(d + 128, s + 16, 32); break;
      case kGgufQ6_K: memcpy(c, s + 208, 2), memcpy(c + 2, s + 192, 16), memcpy(d, s, 192); break;
      case kGgufIq4Xs: {
        // iq4_nl (IQ4_NL's layout): sub-block j of 32 takes the scale d * (ls_j - 32), ls_j 6 bits (4 of scales_l,
        // 2 of scales_h), exact in f32 and rounded to f16 (within 2^-11 relative); its 16 code bytes are IQ4_NL's
        const float dsuper = halfToFloat(static_cast<uint16_t>(s[0] | (s[1] << 8)));
        const int scalesH = s[2] | (s[3] << 8);
        for (int j = 0; j < 8; ++j) {
          const int ls = ((s[4 + j / 2] >> (4 * (j % 2))) & 15) | (((scalesH >> (2 * j)) & 3) << 4);
          const uint16_t h = floatToHalf(dsuper * static_cast<float>(ls - 32));
          c[2 * j] = static_cast<uint8_t>(h & 255), c[2 * j + 1] = static_cast<uint8_t>(h >> 8);
        }
        for (int p = 0; p < 4; ++p) chunkFromBlocks(s + 8 + 32 * p, s + 8 + 32 * p + 16, d + 32 * p);
        break;
      }
      default: break;
    }
  }
}

// All `blocks` blocks, split between the pool's threads in runs of an even count.
inline void ggufRepack(int64_t type, const uint8_t* src, int64_t blocks, uint8_t* data, uint8_t* scales) {
  constexpr int64_t kRun = 4096;  // blocks per claimed chunk (even)
  auto body = [&](int64_t c) {
    const int64_t b0 = c * kRun, b1 = b0 + kRun < blocks ? b0 + kRun : blocks;
    ggufRepackBlocks(type, src, b0, b1, data, scales);
  };
  parallelChunks((blocks + kRun - 1) / kRun, body);
}

}  // namespace kiln
