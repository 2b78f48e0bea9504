// AVX2 + FMA + F16C quantized kernels (CPUs without AVX-512 VNNI: Zen 1-3, Haswell to Comet Lake): quant-impl.inc under
// this file's flags (see binding.gyp), its byte products on vpmaddubsw (quant-impl.inc KILN_Q_AVX2).
#define KILN_QNS qisa_avx2
#define KILN_QTABLE kQuantAvx2
#define KILN_QTABLE_NAME "avx2"
#include "quant-impl.inc"
