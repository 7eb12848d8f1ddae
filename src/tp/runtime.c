/* runtime.c: environment -> mesh -> communicators.
 *
 * The --comm decision is a pure function (runtime_choose_comm) so that its
 * table can be tested on any machine; runtime_init only applies it. This
 * file never includes CUDA: the device facts (GPU or not, how many are
 * visible, this rank's ordinal, the stream) come from the caller, and
 * comm_nccl.h takes the stream as void *. With NCCL the data groups are
 * split from one NCCL world, so only one rendezvous goes through the store.
 */
#include "tp/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "err.h"
#include "parse.h"
#include "tp/comm_shm.h"
#ifdef TPTRAIN_HAVE_NCCL
#include "tp/comm_nccl.h"
#include "tp/store.h"
#endif

/* Integer environment variable set by the launcher, through the project's
 * strict parser: unset means `fallback`; anything else (empty included)
 * must be a whole decimal number in [0, 2^20]. -1 + err when it is not. */
static int env_int(const char *name, int fallback, int *out, char *err, size_t err_len) {
    const char *v = getenv(name);
    if (!v) {
        *out = fallback;
        return 0;
    }
    char what[64];
    snprintf(what, sizeof what, "environment variable %s", name);
    long x;
    if (parse_int(what, v, 0, 1L << 20, &x, err, err_len)) return -1;
    *out = (int)x;
    return 0;
}

int runtime_auto_tp(int world, int local_world, int n_heads, int d_ff) {
    for (int t = local_world; t > 1; t--)
        if (world % t == 0 && n_heads % t == 0 && d_ff % t == 0) return t;
    return 1;
}

bool runtime_have_nccl(void) {
#ifdef TPTRAIN_HAVE_NCCL
    return true;
#else
    return false;
#endif
}

int runtime_comm_parse(const char *s, RuntimeComm *out) {
    static const RuntimeComm all[] = {RUNTIME_COMM_AUTO, RUNTIME_COMM_NCCL, RUNTIME_COMM_SHM};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (s && strcmp(s, runtime_comm_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    return -1;
}

const char *runtime_comm_name(RuntimeComm c) {
    switch (c) {
    case RUNTIME_COMM_AUTO: return "auto";
    case RUNTIME_COMM_NCCL: return "nccl";
    case RUNTIME_COMM_SHM: return "shm";
    }
    return "unknown";
}

int runtime_choose_comm(RuntimeComm request, bool have_nccl, bool device_is_gpu, int world, int local_world,
                        int visible_gpus, RuntimeComm *out, char *err, size_t err_len) {
    if (request != RUNTIME_COMM_AUTO && request != RUNTIME_COMM_NCCL && request != RUNTIME_COMM_SHM) {
        tp_error_set(err, err_len, "--comm must be auto, nccl or shm (got choice %d)", (int)request);
        return -1;
    }
    const bool gpu_per_rank = visible_gpus > 0 && local_world <= visible_gpus;
    const bool nccl_possible = have_nccl && device_is_gpu && gpu_per_rank && world > 1;
    if (request == RUNTIME_COMM_SHM || (request == RUNTIME_COMM_AUTO && !nccl_possible)) {
        *out = RUNTIME_COMM_SHM;
        return 0;
    }
    if (!have_nccl) {
        tp_error_set(err, err_len, "--comm nccl is not available: this build has no NCCL (it needs CUDA, nccl.h and "
                                   "libnccl at build time)");
        return -1;
    }
    if (!device_is_gpu) {
        tp_error_set(err, err_len, "--comm nccl needs the model on a GPU: this run keeps it in host memory");
        return -1;
    }
    if (visible_gpus < 1) {
        tp_error_set(err, err_len, "--comm nccl needs one GPU per rank: no GPU is visible on this node");
        return -1;
    }
    if (!gpu_per_rank) {
        tp_error_set(err, err_len, "--comm nccl needs one GPU per rank: %d ranks share %d GPU%s on this node",
                     local_world, visible_gpus, visible_gpus == 1 ? "" : "s");
        return -1;
    }
    *out = RUNTIME_COMM_NCCL;
    return 0;
}

int runtime_env_local_rank(int *local_rank, char *err, size_t err_len) {
    int rank;
    if (env_int("RANK", 0, &rank, err, err_len)) return -1;
    return env_int("LOCAL_RANK", rank, local_rank, err, err_len);
}

size_t runtime_library_bytes(const Runtime *rt) {
    size_t n = 0;
#ifdef TPTRAIN_HAVE_NCCL
    const Comm *all[] = {rt->nccl_world, rt->tp, rt->dp, rt->pp};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) n += comm_nccl_device_bytes(all[i]);
#else
    (void)rt;
#endif
    return n;
}

/* Rank, world and job id from the environment (a world of one without it). */
static int read_env(Runtime *rt, int *world, int *rank, char *err, size_t err_len) {
    if (env_int("WORLD_SIZE", 1, world, err, err_len) || env_int("RANK", 0, rank, err, err_len) ||
        env_int("LOCAL_RANK", *rank, &rt->local_rank, err, err_len) ||
        env_int("LOCAL_WORLD_SIZE", *world, &rt->local_world, err, err_len))
        return -1;
    if (*world < 1 || *rank >= *world) {
        tp_error_set(err, err_len, "RANK %d is not below WORLD_SIZE %d", *rank, *world);
        return -1;
    }
    rt->launched = getenv("RANK") != NULL;
    const char *job = getenv("TPRUN_JOB_ID");
    if (job && *job) {
        snprintf(rt->job_id, sizeof rt->job_id, "%s", job);
    } else if (*world == 1) {
        snprintf(rt->job_id, sizeof rt->job_id, "solo%ld%lx", (long)getpid(), (unsigned long)time(NULL));
    } else {
        tp_error_set(err, err_len, "WORLD_SIZE is %d but TPRUN_JOB_ID is not set: start the ranks with tprun", *world);
        return -1;
    }
    return 0;
}

/* tp x dp x pp from the options (0 = automatic), checked against the model. */
static int layout(Runtime *rt, const RuntimeOptions *opt, int world, int rank, char *err, size_t err_len) {
    int tp = opt->tp, dp = opt->dp, pp = opt->pp ? opt->pp : 1;
    if (tp < 0 || dp < 0 || pp < 1 || world % pp) {
        tp_error_set(err, err_len, "the layout tp %d, dp %d, pp %d does not fit the world size %d", tp, dp, pp, world);
        return -1;
    }
    const int stage_world = world / pp;  // ranks per pipeline stage
    char what[96];
    if (pp == 1) snprintf(what, sizeof what, "the world size %d", world);
    else snprintf(what, sizeof what, "the %d ranks of a pipeline stage (world %d / pp %d)", stage_world, world, pp);
    if (tp == 0 && dp == 0) tp = runtime_auto_tp(stage_world, rt->local_world, opt->n_heads, opt->d_ff);
    if (tp == 0) {
        if (stage_world % dp) {
            tp_error_set(err, err_len, "dp (%d) does not divide %s", dp, what);
            return -1;
        }
        tp = stage_world / dp;
    }
    if (dp == 0) {
        if (stage_world % tp) {
            tp_error_set(err, err_len, "tp (%d) does not divide %s", tp, what);
            return -1;
        }
        dp = stage_world / tp;
    }
    if (mesh_init(&rt->mesh, world, rank, tp, dp, pp, err, err_len)) return -1;
    if (opt->n_heads % tp) {
        tp_error_set(err, err_len, "n_heads (%d) is not divisible by tp (%d)", opt->n_heads, tp);
        return -1;
    }
    if (opt->d_ff % tp) {
        tp_error_set(err, err_len, "d_ff (%d) is not divisible by tp (%d)", opt->d_ff, tp);
        return -1;
    }
    return 0;
}

/* Group names: a group is named by its fixed coordinates. */
static void group_names(const Mesh *m, char tp[64], char dp[64], char pp[64]) {
    snprintf(tp, 64, "tp.d%d.p%d", m->dp_rank, m->pp_rank);
    snprintf(dp, 64, "dp.t%d.p%d", m->tp_rank, m->pp_rank);
    snprintf(pp, 64, "pp.t%d.d%d", m->tp_rank, m->dp_rank);
}

static int shm_groups(Runtime *rt, const RuntimeOptions *opt, char *err, size_t err_len) {
    const Mesh *m = &rt->mesh;
    char tp[64], dp[64], pp[64];
    group_names(m, tp, dp, pp);
    if (!(rt->tp = comm_shm_create(rt->job_id, tp, m->tp_rank, m->tp, opt->timeout_s, err, err_len))) return -1;
    if (!(rt->dp = comm_shm_create(rt->job_id, dp, m->dp_rank, m->dp, opt->timeout_s, err, err_len))) return -1;
    if (!(rt->pp = comm_shm_create(rt->job_id, pp, m->pp_rank, m->pp, opt->timeout_s, err, err_len))) return -1;
    if (!rt->staged) return 0;
    Comm *const groups[3] = {rt->tp, rt->dp, rt->pp};
    for (int i = 0; i < 3; i++)
        if (comm_set_device_copy(groups[i], opt->device_copy) != 0) {
            tp_error_set(err, err_len, "%s", comm_error(groups[i]));
            return -1;
        }
    return 0;
}

#ifdef TPTRAIN_HAVE_NCCL
/* The NCCL world meets through tprun's store; tp, dp and pp are split from it. */
static int nccl_groups(Runtime *rt, const RuntimeOptions *opt, char *err, size_t err_len) {
    const Mesh *m = &rt->mesh;
    StoreClient *store = NULL;
    if (m->world > 1) {
        const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT"), *token = getenv("TPRUN_TOKEN");
        if (!addr || !*addr || !port || !*port || !token || !*token) {
            tp_error_set(err, err_len, "NCCL groups meet through tprun's store, but MASTER_ADDR, MASTER_PORT and "
                                       "TPRUN_TOKEN are not all set: start the ranks with tprun");
            return -1;
        }
        char why[512];
        long port_n;
        if (parse_int("environment variable MASTER_PORT", port, 1, 65535, &port_n, err, err_len)) return -1;
        store = store_connect(addr, (int)port_n, token, opt->timeout_s, why, sizeof why);
        if (!store) {
            tp_error_set(err, err_len, "cannot reach tprun's store for NCCL: %s", why);
            return -1;
        }
    }
    rt->nccl_world = comm_nccl_create(store, rt->job_id, "world", m->rank, m->world, opt->device, opt->timeout_s,
                                      opt->stream, err, err_len);
    if (store) store_close(store);
    if (!rt->nccl_world) return -1;
    char tp[64], dp[64], pp[64];
    group_names(m, tp, dp, pp);
    // color: the group's fixed coordinates as one number; key: the rank inside the group.
    if (comm_nccl_split(rt->nccl_world, tp, m->dp_rank + m->dp * m->pp_rank, m->tp_rank, &rt->tp, err, err_len) ||
        comm_nccl_split(rt->nccl_world, dp, m->tp_rank + m->tp * m->pp_rank, m->dp_rank, &rt->dp, err, err_len) ||
        comm_nccl_split(rt->nccl_world, pp, m->tp_rank + m->tp * m->dp_rank, m->pp_rank, &rt->pp, err, err_len))
        return -1;
    return 0;
}
#endif

int runtime_init(Runtime *rt, const RuntimeOptions *opt, char *err, size_t err_len) {
    memset(rt, 0, sizeof *rt);
    int world, rank;
    if (read_env(rt, &world, &rank, err, err_len) || layout(rt, opt, world, rank, err, err_len)) return -1;
    if (runtime_choose_comm(opt->comm, runtime_have_nccl(), opt->device_is_gpu, world, rt->local_world,
                            opt->n_visible_gpus, &rt->comm, err, err_len))
        return -1;
    rt->staged = rt->comm == RUNTIME_COMM_SHM && opt->device_is_gpu;
    if (rt->staged && !opt->device_copy) {
        tp_error_set(err, err_len, "shared-memory groups with GPU buffers need the backend's device-copy hooks "
                                   "(RuntimeOptions.device_copy)");
        return -1;
    }
    const Mesh *m = &rt->mesh;
    rt->ctrl = comm_shm_create(rt->job_id, "world", m->rank, m->world, opt->timeout_s, err, err_len);
    if (!rt->ctrl) goto fail;
#ifdef TPTRAIN_HAVE_NCCL
    if (rt->comm == RUNTIME_COMM_NCCL) {
        if (nccl_groups(rt, opt, err, err_len)) goto fail;
        return 0;
    }
#endif
    if (shm_groups(rt, opt, err, err_len)) goto fail;
    return 0;
fail:
    runtime_free(rt);
    return -1;
}

void runtime_free(Runtime *rt) {
    Comm **all[] = {&rt->pp, &rt->dp, &rt->tp, &rt->nccl_world, &rt->ctrl};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        comm_free(*all[i]);
        *all[i] = NULL;
    }
}
