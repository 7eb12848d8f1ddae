/* cublaslt_load.c: cuBLASLt opened when the CUDA backend is created, not
 * linked. libcublasLt's static initialisers cost about 0.5 s of CPU at every
 * start of a program linked with it, CPU runs included (2-core CPU machine,
 * a program that does nothing: 0.53 s linked, 0.00 s not), and the launcher
 * and the tests start programs hundreds of times.
 *
 * The 14 functions the CUDA backend calls are defined here with cublasLt.h's
 * own prototypes, so gemm_plan.cu calls them unchanged; each forwards through
 * a pointer that cublaslt_load resolves once (dlopen of the soname of the
 * toolkit we were built with, found like a linked library: LD_LIBRARY_PATH,
 * the program's RUNPATH, ld.so's cache). backend_cuda_create starts the
 * load on a thread of its own (cublaslt_load_start), so its start-up runs
 * beside the program's (the corpus, the model's initialisation) instead of
 * before them; the first forwarded call waits for it, and a missing
 * library is that call's one sentence, not a crash. */
#include <cublasLt.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "cuda_gemm.h"
#include "err.h"

#define LT_STR2(x) #x
#define LT_STR(x) LT_STR2(x)
#define CUBLASLT_SONAME "libcublasLt.so." LT_STR(CUBLAS_VER_MAJOR)

#define LT_FUNCS(X)                                                                                            \
    X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtGetStatusName) X(cublasLtGetStatusString) X(cublasLtMatmul) \
    X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy)                \
    X(cublasLtMatmulDescSetAttribute) X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy)    \
    X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)

static struct {
#define LT_MEMBER(f) __typeof__(&f) f;
    LT_FUNCS(LT_MEMBER)
#undef LT_MEMBER
} lt;

static pthread_mutex_t lt_mutex = PTHREAD_MUTEX_INITIALIZER;
static int lt_loaded;            // every pointer in lt is set
static int lt_started;           // cublaslt_load_start made its thread
static char lt_error[512];       // why the last attempt failed

/* Opens soname and resolves every function, or fills lt_error. Under lt_mutex. */
static int lt_open(const char *soname) {
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(lt_error, sizeof lt_error, "cannot load cuBLASLt (%s), which --device cuda needs: %s; put the "
                 "CUDA toolkit's library folder on LD_LIBRARY_PATH", soname, dlerror());
        return -1;
    }
#define LT_RESOLVE(f)                                                                                 \
    if (!(*(void **)&lt.f = dlsym(h, #f))) {                                                          \
        snprintf(lt_error, sizeof lt_error, "%s has no %s: a cuBLASLt older than the toolkit this "    \
                 "build was compiled with (CUDA %d)", soname, #f, CUBLAS_VER_MAJOR);                  \
        dlclose(h);                                                                                   \
        return -1;                                                                                    \
    }
    LT_FUNCS(LT_RESOLVE)
#undef LT_RESOLVE
    lt_loaded = 1;
    return 0;
}

int cublaslt_load_from(const char *soname, char *err, size_t err_len) {
    pthread_mutex_lock(&lt_mutex);
    int rc = lt_loaded ? 0 : lt_open(soname);
    if (rc) tp_error_set(err, err_len, "%s", lt_error);
    pthread_mutex_unlock(&lt_mutex);
    return rc;
}

int cublaslt_load(char *err, size_t err_len) { return cublaslt_load_from(CUBLASLT_SONAME, err, err_len); }

static void *lt_loader(void *arg) {
    (void)arg;
    char err[512];
    (void)cublaslt_load(err, sizeof err);  // a failure is told by the first call that needs the library
    return NULL;
}

void cublaslt_load_start(void) {
    pthread_mutex_lock(&lt_mutex);
    const bool go = !lt_loaded && !lt_started;
    lt_started = 1;
    pthread_mutex_unlock(&lt_mutex);
    if (!go) return;
    pthread_attr_t attr;
    pthread_t t;
    if (pthread_attr_init(&attr) != 0) return;  // no thread: the first call loads it
    (void)pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    (void)pthread_create(&t, &attr, lt_loader, NULL);
    pthread_attr_destroy(&attr);
}

bool cublaslt_is_loaded(void) {
    pthread_mutex_lock(&lt_mutex);
    bool loaded = lt_loaded;
    pthread_mutex_unlock(&lt_mutex);
    return loaded;
}

/* Every forwarder: the library, loaded by now (backend_cuda_create), or a stop. */
static void lt_need(void) {
    char err[512];
    if (!cublaslt_is_loaded() && cublaslt_load(err, sizeof err)) tp_die(__FILE__, __LINE__, "%s", err);
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) { return lt_need(), lt.cublasLtCreate(h); }
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { return lt_need(), lt.cublasLtDestroy(h); }
const char *cublasLtGetStatusName(cublasStatus_t s) { return lt_need(), lt.cublasLtGetStatusName(s); }
const char *cublasLtGetStatusString(cublasStatus_t s) { return lt_need(), lt.cublasLtGetStatusString(s); }

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t a_desc, const void *B, cublasLtMatrixLayout_t b_desc,
                              const void *beta, const void *C, cublasLtMatrixLayout_t c_desc, void *D,
                              cublasLtMatrixLayout_t d_desc, const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
    lt_need();
    return lt.cublasLtMatmul(h, desc, alpha, A, a_desc, B, b_desc, beta, C, c_desc, D, d_desc, algo, workspace,
                             workspace_bytes, stream);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a_desc, cublasLtMatrixLayout_t b_desc,
                                              cublasLtMatrixLayout_t c_desc, cublasLtMatrixLayout_t d_desc,
                                              cublasLtMatmulPreference_t pref, int n_asked,
                                              cublasLtMatmulHeuristicResult_t results[], int *n_found) {
    lt_need();
    return lt.cublasLtMatmulAlgoGetHeuristic(h, desc, a_desc, b_desc, c_desc, d_desc, pref, n_asked, results,
                                             n_found);
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
    return lt_need(), lt.cublasLtMatmulDescCreate(desc, compute, scale);
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    return lt_need(), lt.cublasLtMatmulDescDestroy(desc);
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t n_bytes) {
    return lt_need(), lt.cublasLtMatmulDescSetAttribute(desc, attr, buf, n_bytes);
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    return lt_need(), lt.cublasLtMatmulPreferenceCreate(pref);
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    return lt_need(), lt.cublasLtMatmulPreferenceDestroy(pref);
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t n_bytes) {
    return lt_need(), lt.cublasLtMatmulPreferenceSetAttribute(pref, attr, buf, n_bytes);
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    return lt_need(), lt.cublasLtMatrixLayoutCreate(layout, type, rows, cols, ld);
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    return lt_need(), lt.cublasLtMatrixLayoutDestroy(layout);
}
