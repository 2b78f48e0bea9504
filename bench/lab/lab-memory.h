// Memory for the kernel labs (bench/lab/*.cc): as the engine keeps weights (cpu-backend moveToHugePages).
#pragma once
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

// n bytes (rounded up to 2 MiB) on 2 MiB-aligned memory advised MADV_HUGEPAGE, filled with ones: untouched pages
// would read as the zero page.
inline void* hugeAlloc(size_t n) {
  const size_t align = size_t{2} << 20;
  n = (n + align - 1) / align * align;
  void* p = aligned_alloc(align, n);
  madvise(p, n, MADV_HUGEPAGE);
  memset(p, 1, n);
  return p;
}
