/* runtime.c: environment -> mesh -> communicators. */
#include "tp/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "err.h"
#include "parse.h"
#include "tp/comm_shm.h"

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

int runtime_init(Runtime *rt, int tp, int dp, int n_heads, int d_ff, double timeout_s, char *err, size_t err_len) {
    memset(rt, 0, sizeof *rt);
    int world, rank;
    if (env_int("WORLD_SIZE", 1, &world, err, err_len) || env_int("RANK", 0, &rank, err, err_len) ||
        env_int("LOCAL_RANK", rank, &rt->local_rank, err, err_len) ||
        env_int("LOCAL_WORLD_SIZE", world, &rt->local_world, err, err_len))
        return -1;
    if (world < 1 || rank >= world) {
        tp_error_set(err, err_len, "RANK %d is not below WORLD_SIZE %d", rank, world);
        return -1;
    }
    rt->launched = getenv("RANK") != NULL;
    const char *job = getenv("TPRUN_JOB_ID");
    if (job && *job) {
        snprintf(rt->job_id, sizeof rt->job_id, "%s", job);
    } else if (world == 1) {
        snprintf(rt->job_id, sizeof rt->job_id, "solo%ld%lx", (long)getpid(), (unsigned long)time(NULL));
    } else {
        tp_error_set(err, err_len, "WORLD_SIZE is %d but TPRUN_JOB_ID is not set: start the ranks with tprun", world);
        return -1;
    }
    if (tp == 0 && dp == 0) tp = runtime_auto_tp(world, rt->local_world, n_heads, d_ff);
    if (tp == 0) {
        if (world % dp) {
            tp_error_set(err, err_len, "dp (%d) does not divide the world size %d", dp, world);
            return -1;
        }
        tp = world / dp;
    }
    if (dp == 0) {
        if (world % tp) {
            tp_error_set(err, err_len, "tp (%d) does not divide the world size %d", tp, world);
            return -1;
        }
        dp = world / tp;
    }
    if (mesh_init(&rt->mesh, world, rank, tp, dp, 1, err, err_len)) return -1;
    if (n_heads % tp) {
        tp_error_set(err, err_len, "n_heads (%d) is not divisible by tp (%d)", n_heads, tp);
        return -1;
    }
    if (d_ff % tp) {
        tp_error_set(err, err_len, "d_ff (%d) is not divisible by tp (%d)", d_ff, tp);
        return -1;
    }
    const Mesh *m = &rt->mesh;
    char name[64], why[512];
    rt->world = comm_shm_create(rt->job_id, "world", m->rank, world, timeout_s, why, sizeof why);
    if (!rt->world) goto fail;
    snprintf(name, sizeof name, "tp.d%d.p%d", m->dp_rank, m->pp_rank);
    rt->tp = comm_shm_create(rt->job_id, name, m->tp_rank, m->tp, timeout_s, why, sizeof why);
    if (!rt->tp) goto fail;
    snprintf(name, sizeof name, "dp.t%d.p%d", m->tp_rank, m->pp_rank);
    rt->dp = comm_shm_create(rt->job_id, name, m->dp_rank, m->dp, timeout_s, why, sizeof why);
    if (!rt->dp) goto fail;
    return 0;
fail:
    tp_error_set(err, err_len, "%s", why);
    runtime_free(rt);
    return -1;
}

void runtime_free(Runtime *rt) {
    if (rt->dp) comm_free(rt->dp);
    if (rt->tp) comm_free(rt->tp);
    if (rt->world) comm_free(rt->world);
    rt->world = rt->tp = rt->dp = NULL;
}
