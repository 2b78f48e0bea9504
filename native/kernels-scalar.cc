// scalar kernel table: kernels-impl.inc compiled with this file's ISA flags (see binding.gyp).
#define KILN_NS isa_scalar
#define KILN_VW 4
#define KILN_MR 6
#define KILN_NV 2
#define KILN_TABLE kScalarKernels
#define KILN_TABLE_NAME "scalar"
#include "kernels-impl.inc"
