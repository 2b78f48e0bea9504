// avx2 kernel table: kernels-impl.inc compiled with this file's ISA flags (see binding.gyp).
#define KILN_NS isa_avx2
#define KILN_VW 8
#define KILN_MR 6
#define KILN_NV 2
#define KILN_TABLE kAvx2Kernels
#define KILN_TABLE_NAME "avx2"
#include "kernels-impl.inc"
