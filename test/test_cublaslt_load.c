/* test_cublaslt_load.c: cuBLASLt is opened when the CUDA backend is made,
 * never at start-up (kernels/cuda/cublaslt_load.c). A program linked with
 * the kernels does not map libcublasLt when it starts, nor after making a
 * CPU backend (asked for, or chosen by auto without a GPU); a missing
 * library is one sentence naming it; cublaslt_load_start (twice) loads it
 * on a thread, cublaslt_load then opens nothing twice, and a call
 * forwarded through it answers. Runs on any
 * machine with the toolkit (label cpu); built only with CUDA. */
#include <cublasLt.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "check.h"
#include "cuda/cuda_gemm.h"

/* Whether this process maps a file whose name contains what. */
static bool mapped(const char *what) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return false;
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, what) != NULL;
    fclose(f);
    return found;
}

int main(void) {
    char err[512];
    CHECK(!mapped("libcublasLt"), "libcublasLt is mapped at start-up: it is linked again");
    CHECK(!cublaslt_is_loaded(), "cuBLASLt loaded before anything asked for it");

    Backend *be = backend_create(DEVICE_CPU, DTYPE_F32, 0, err, sizeof err);
    CHECK(be != NULL, "CPU backend: %s", err);
    backend_destroy(be);
    int n_gpus = 0;
    if (!backend_cuda_available(&n_gpus)) {  // auto chooses the CPU here
        be = backend_create(DEVICE_AUTO, DTYPE_F32, 0, err, sizeof err);
        CHECK(be != NULL, "auto backend: %s", err);
        backend_destroy(be);
    }
    CHECK(!mapped("libcublasLt") && !cublaslt_is_loaded(), "a CPU backend loaded cuBLASLt");

    const char *missing = "libcublasLt.so.0-missing";
    CHECK(cublaslt_load_from(missing, err, sizeof err) == -1, "a missing library was loaded");
    CHECK(strstr(err, missing) && strstr(err, "--device cuda") && !strchr(err, '\n'),
          "the refusal names the library and what needs it, in one line: %s", err);
    printf("refused as expected: %s\n", err);
    CHECK(!cublaslt_is_loaded(), "loaded after a failed attempt");

    cublaslt_load_start();
    cublaslt_load_start();  // a second start: nothing more
    CHECK(cublaslt_load(err, sizeof err) == 0, "the toolkit's cuBLASLt: %s", err);
    CHECK(cublaslt_is_loaded() && mapped("libcublasLt"), "cuBLASLt not mapped after cublaslt_load");
    const char *name = cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(name && strcmp(name, "CUBLAS_STATUS_NOT_SUPPORTED") == 0, "forwarded status name: %s",
          name ? name : "(null)");
    CHECK(cublaslt_load(err, sizeof err) == 0, "a second load: %s", err);
    return check_report("test_cublaslt_load");
}
