/* ckpt_verify.c: every check a load runs, without a model (checkpoint.h's
 * ckpt_verify, for `ckpt verify`).
 *
 * Calls: ckpt_load.c's saved layout (ckpt_internal.h), ckpt_pieces.h, common/.
 */
#include "train/checkpoint.h"
#include "train/ckpt_internal.h"
#include "train/ckpt_pieces.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "err.h"
#include "fileio.h"
#include "safetensors.h"

/* ---- verify: every check a load runs, without a model ------------------------------ */

/* The model shard (p, t) and its tensors, as read_saved checks them. */
static int verify_model_shard(SavedFiles *sf, int p, int t, char *err, size_t err_len) {
    const StFile *f = saved_file(sf, p, t, 0, err, err_len);
    if (!f) return -1;
    const ParamTable *tab = &sf->tabs[p];
    for (int i = 0; i < tab->n; i++)
        if (!shard_tensor(f, tab->t[i].name, &tab->t[i], sf->path[saved_slot(sf, p, t, 0)], err, err_len)) return -1;
    return 0;
}

/* The optimizer shards of (p, t): whole moments of the tensors dealt to
 * each dp file, or ZeRO pieces covering every tensor exactly once. */
static int verify_optim_shards(SavedFiles *sf, int p, int t, bool pieces, float *loc, char *err, size_t err_len) {
    const ParamTable *tab = &sf->tabs[p];
    for (int d = 0; d < sf->dp; d++)
        if (!saved_file(sf, p, t, 1 + d, err, err_len)) return -1;
    const int f0 = saved_slot(sf, p, t, 1);
    for (int i = 0; i < tab->n; i++) {
        for (int kind = 1; kind <= 2; kind++) {
            const char *kname = kind == 1 ? "exp_avg" : "exp_avg_sq";
            if (pieces) {
                if (opt_pieces_read(&sf->f[f0], &sf->path[f0], sf->dp, &tab->t[i], kname, loc, err, err_len)) return -1;
                continue;
            }
            char name[160];
            snprintf(name, sizeof name, "%s.%s", kname, tab->t[i].name);
            const int k = f0 + i % sf->dp;
            if (!shard_tensor(&sf->f[k], name, &tab->t[i], sf->path[k], err, err_len)) return -1;
        }
    }
    return 0;
}

/* Frees the files of (p, t): one shard group in memory at a time. */
static void release_shards(SavedFiles *sf, int p, int t) {
    for (int k = 0; k < sf->per; k++) {
        const int i = saved_slot(sf, p, t, k);
        if (sf->loaded[i]) st_free(&sf->f[i]);
        sf->loaded[i] = false;
    }
}

int ckpt_verify(const char *dir, int what, char *err, size_t err_len) {
    SavedCkpt c;
    float *loc = NULL;
    int rc = -1;
    if (saved_open(&c, dir, true, err, err_len)) goto done;
    size_t max_local = 1;
    for (int p = 0; p < c.saved->pp; p++)
        for (int i = 0; i < c.tabs[p].n; i++)
            max_local = c.tabs[p].t[i].n_elems > max_local ? c.tabs[p].t[i].n_elems : max_local;
    loc = TP_MALLOC(max_local * sizeof(float));
    for (int p = 0; p < c.saved->pp; p++)
        for (int t = 0; t < c.tp; t++) {
            if ((what & CKPT_VERIFY_MODEL) && verify_model_shard(&c.sf, p, t, err, err_len)) goto done;
            if ((what & CKPT_VERIFY_OPTIM) &&
                verify_optim_shards(&c.sf, p, t, c.saved->zero_stage > 0, loc, err, err_len))
                goto done;
            release_shards(&c.sf, p, t);
        }
    if ((what & CKPT_VERIFY_MODEL) && c.saved->corpus &&
        ckpt_verify_file(dir, c.sf.files, "spm.model", err, err_len))
        goto done;
    rc = 0;
done:
    free(loc);
    saved_close(&c);
    return rc;
}
