// Portable quantized kernels: quant-impl.inc with no ISA flags (see quant.h).
#define KILN_QNS qisa_scalar
#define KILN_QTABLE kQuantScalar
#define KILN_QTABLE_NAME "scalar"
#include "quant-impl.inc"
