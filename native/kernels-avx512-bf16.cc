// avx512-bf16 kernel table: the avx512 kernels plus the vdpbf16ps GEMM for large-M bf16 products
// (gemm-bf16-impl.inc), compiled with -mavx512bf16 (see binding.gyp); chosen only on CPUs with it.
#define KILN_NS isa_avx512_bf16
#define KILN_VW 16
#define KILN_MR 14
#define KILN_NV 2
#define KILN_BF16_DOT 1
#define KILN_TABLE kAvx512Bf16Kernels
#define KILN_TABLE_NAME "avx512-bf16"
#include "kernels-impl.inc"
