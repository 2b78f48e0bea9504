// AVX-512 BW + VNNI quantized kernels: quant-impl.inc under this file's flags (see binding.gyp).
#define KILN_QNS qisa_avx512
#define KILN_QTABLE kQuantAvx512
#define KILN_QTABLE_NAME "avx512-vnni"
#include "quant-impl.inc"
