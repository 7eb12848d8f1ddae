/* memory.c: fills and copies, so model code never touches memory directly
 * and the CUDA backend can implement the same calls on device pointers. */
#include <string.h>
#include "cpu_ops.h"

/* Zero sizes are no-ops even with NULL pointers (memset and memmove may not
 * be handed NULL), as on the GPU. */
void cpu_zero(float *x, size_t n_elems) {
    if (n_elems) memset(x, 0, n_elems * sizeof *x);
}

void cpu_copy(float *dst, const float *src, size_t n_elems) {
    if (n_elems && dst != src) memmove(dst, src, n_elems * sizeof *dst);
}

void cpu_copy_ids(int32_t *dst, const int32_t *src, size_t n_elems) {
    if (n_elems && dst != src) memmove(dst, src, n_elems * sizeof *dst);
}
