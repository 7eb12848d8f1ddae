/* backend_list.c: the backends this build links, listed for backend.c
 * (backend.h's backend_entries): CUDA first when the build has it
 * (TPTRAIN_HAVE_CUDA, set by CMakeLists.txt for this file alone), the CPU
 * always. The one place that names the backends. */
#include "backend.h"

#include <stddef.h>

const BackendEntry *const backend_entries[] = {
#ifdef TPTRAIN_HAVE_CUDA
    &backend_cuda_entry,
#endif
    &backend_cpu_entry,
    NULL,
};
