// avx512 kernel table: kernels-impl.inc compiled with this file's ISA flags (see binding.gyp).
#define KILN_NS isa_avx512
#define KILN_VW 16
#define KILN_MR 14
#define KILN_NV 2
#define KILN_TABLE kAvx512Kernels
#define KILN_TABLE_NAME "avx512"
#include "kernels-impl.inc"
