/* dataset.c: length-bucketed batches for one data-parallel rank.
 *
 * The cursor is the only state. The plan of an epoch (the usable pairs in
 * batch order and where each global batch starts) is rebuilt from
 * (seed, epoch) whenever the cursor enters another epoch. Lengths are small
 * integers (at most max_len), so sorting is two stable counting-sort passes
 * and the cut is linear: a plan over 50k pairs costs about a millisecond.
 *
 * The cut keeps every rank's share within the per-rank budget: a global
 * batch of n pairs whose longest padded side is m deals at most
 * ceil(n / dp) pairs to a rank, so it is allowed when ceil(n / dp) * m <=
 * batch_tokens and n >= dp. A greedy cut can strand fewer than dp pairs at
 * the end, so the cut is chosen by a linear dynamic program over the sorted
 * pairs that finds a cut where every batch obeys both rules, taking the
 * largest batches it can. Only when none exists (some batch must hold more
 * than dp pairs too long to share a rank) does it fall back to greedy and
 * merge the short tail into the batch before it.
 *
 * Evaluation batches need no shuffling: `usable` is kept length-sorted, so
 * the eval cut is a greedy walk over it, recomputed per call (cheap next to
 * a forward pass) because the Dataset struct has no room for another plan.
 */
#include "data/dataset.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "data/splitmix.h"
#include "err.h"

/* Arrays of a value per pair: at millions of pairs, faulting them in 4 KiB
 * pages costs more than filling them, so they ask for huge pages. */
static void *pair_array(size_t bytes) {
    enum { HUGE = 2u << 20 };
    if (bytes < HUGE) return TP_MALLOC(bytes ? bytes : 1);
    void *p = NULL;
    TP_CHECK(posix_memalign(&p, HUGE, (bytes + HUGE - 1) / HUGE * HUGE) == 0, "out of memory for %zu bytes", bytes);
    madvise(p, (bytes + HUGE - 1) / HUGE * HUGE, MADV_HUGEPAGE);  // advice: ignored where not supported
    return p;
}

/* ---- lengths -------------------------------------------------------------- */

/* Pair p's token file (its corpus) and its index there. */
static const TokenFile *pair_file(const Dataset *ds, int32_t p, int32_t *local) {
    int k = 0;
    while (p >= ds->first[k + 1]) k++;
    *local = p - ds->first[k];
    return ds->tfs[k];
}
static const uint64_t *src_off_of(const Dataset *ds, const TokenFile *tf) {
    return ds->dir == DIR_EN_JA ? tf->en_off : tf->ja_off;
}
static const uint64_t *tgt_off_of(const Dataset *ds, const TokenFile *tf) {
    return ds->dir == DIR_EN_JA ? tf->ja_off : tf->en_off;
}

/* Pieces of each side; only called for usable pairs (fit in int). */
static int src_pieces(const Dataset *ds, int32_t p) {
    int32_t i;
    const uint64_t *o = src_off_of(ds, pair_file(ds, p, &i));
    return (int)(o[i + 1] - o[i]);
}
static int tgt_pieces(const Dataset *ds, int32_t p) {
    int32_t i;
    const uint64_t *o = tgt_off_of(ds, pair_file(ds, p, &i));
    return (int)(o[i + 1] - o[i]);
}
/* A length padded up to the bucket: a multiple of length_bucket, at most
 * max_len (which every usable side fits). */
static int bucketed(const Dataset *ds, int len) {
    const int n = ds->length_bucket > 1 ? ds->length_bucket : 1;
    const int up = (len + n - 1) / n * n;
    return up < ds->max_len ? up : (len > ds->max_len ? len : ds->max_len);
}

/* ---- the per-epoch generator -------------------------------------------------- */

static uint64_t epoch_state(uint64_t seed, int64_t epoch) {
    uint64_t a = seed ^ 0x6A09E667F3BCC908ull, b = (uint64_t)epoch ^ 0xBB67AE8584CAA73Bull;
    uint64_t ka = splitmix64(&a), kb = splitmix64(&b);
    return ka ^ (kb * 0xD1B54A32D192ED03ull);
}

/* Uniform in [0, n); the modulo bias (n / 2^64) is far below any effect. */
static uint64_t below(uint64_t *state, uint64_t n) { return splitmix64(state) % n; }

/* Fisher-Yates from the top. The draws do not depend on the array, so a
 * block of them is made first and the entries they will touch are fetched
 * ahead: at millions of entries each swap would otherwise wait for memory
 * in turn. */
static void shuffle_u64(uint64_t *a, int n, uint64_t *state) {
    enum { AHEAD = 64 };
    int js[AHEAD];
    for (int i = n - 1; i > 0;) {
        const int m = i < AHEAD ? i : AHEAD;
        for (int k = 0; k < m; k++) {
            js[k] = (int)below(state, (uint64_t)(i - k) + 1);
            __builtin_prefetch(&a[js[k]], 1);
        }
        for (int k = 0; k < m; k++, i--) {
            uint64_t t = a[i];
            a[i] = a[js[k]];
            a[js[k]] = t;
        }
    }
}

/* ---- sort and cut -------------------------------------------------------------- */

/* A usable pair's sort key: its raw length, the longest side unbucketed,
 * max(src + eos, bos + tgt), and its source pieces, packed as
 * (raw - 1) << 16 | source pieces (both
 * below 2^16 for max_len <= 65536), carried beside the pair's
 * index in the plan's entries (key << 32 | index), so sorting and cutting
 * read no offsets: at millions of pairs those reads, scattered over the
 * token file's tables, were most of a start's batching time. */
static int key_raw(uint32_t k) { return (int)(k >> 16) + 1; }
static int ent_raw(uint64_t e) { return key_raw((uint32_t)(e >> 32)); }
static int ent_src(uint64_t e) { return (int)(e >> 32 & 0xFFFF); }
static int32_t ent_pair(uint64_t e) { return (int32_t)(uint32_t)e; }
/* The key of a pair of ls source and lt target pieces (both at least 1). */
static uint32_t length_key(uint64_t ls, uint64_t lt) {
    const int raw = (int)(ls > lt ? ls : lt) + 1;
    return (uint32_t)(raw - 1) << 16 | (uint32_t)ls;
}

/* Stable sort of the entries a (n) by (raw length, source length):
 * counting sort by the minor key, then by the major key. tmp (n) and
 * cnt (max_len + 2) are scratch. */
static void sort_by_length(const Dataset *ds, uint64_t *a, uint64_t *tmp, int32_t *cnt, int n) {
    const int n_keys = ds->max_len + 1;
    memset(cnt, 0, (size_t)(n_keys + 1) * sizeof *cnt);
    for (int i = 0; i < n; i++) cnt[ent_src(a[i]) + 1]++;
    for (int k = 0; k < n_keys; k++) cnt[k + 1] += cnt[k];
    for (int i = 0; i < n; i++) tmp[cnt[ent_src(a[i])]++] = a[i];

    memset(cnt, 0, (size_t)(n_keys + 1) * sizeof *cnt);
    for (int i = 0; i < n; i++) cnt[ent_raw(tmp[i]) + 1]++;
    for (int k = 0; k < n_keys; k++) cnt[k + 1] += cnt[k];
    for (int i = 0; i < n; i++) a[cnt[ent_raw(tmp[i])]++] = tmp[i];
}

/* Largest batch that may end with sorted entry a[e - 1]: ceil(n/dp) * m <= budget. */
static int64_t batch_cap(const Dataset *ds, const uint64_t *a, int e, int dp) {
    return (int64_t)(ds->batch_tokens / bucketed(ds, ent_raw(a[e - 1]))) * dp;
}

/* Cuts the length-sorted pairs a (n >= dp) into batches of at least dp
 * pairs; bounds[0..nb] receives the boundaries (bounds[0] = 0, bounds[nb] = n).
 * Returns nb. scratch holds 2 * (n + 1) ints. */
static int cut_batches(const Dataset *ds, const uint64_t *a, int n, int dp, int32_t *bounds, int32_t *scratch) {
    /* ok(e): a[0..e) can be cut legally. prev[x] = largest s <= x with ok(s). */
    int32_t *prev = scratch, *next = scratch + n + 1;
    prev[0] = 0;
    for (int e = 1; e <= n; e++) {
        bool ok = false;
        int hi = e - dp;
        if (hi >= 0) {
            int64_t lo = e - batch_cap(ds, a, e, dp);
            ok = prev[hi] >= lo;
        }
        prev[e] = ok ? e : prev[e - 1];
    }
    int nb = 0;
    if (prev[n] == n) {
        /* next[x] = smallest s >= x with ok(s); walk back taking the largest batch. */
        next[n] = n;
        for (int x = n - 1; x >= 0; x--) next[x] = prev[x] == x ? x : next[x + 1];
        for (int e = n; e > 0;) {
            int64_t lo = e - batch_cap(ds, a, e, dp);
            int s = next[lo > 0 ? lo : 0];
            bounds[nb++] = e;
            e = s;
        }
        bounds[nb] = 0;
        for (int i = 0, j = nb; i < j; i++, j--) {
            int32_t t = bounds[i];
            bounds[i] = bounds[j];
            bounds[j] = t;
        }
        return nb;
    }
    /* No legal cut exists: greedy, then the short tail joins the batch before. */
    bounds[0] = 0;
    int s = 0;
    for (int p = 0; p < n; p++) {
        if (p - s >= dp && p - s + 1 > batch_cap(ds, a, p + 1, dp)) {
            bounds[++nb] = p;
            s = p;
        }
    }
    bounds[++nb] = n;
    if (nb > 1 && n - bounds[nb - 1] < dp) bounds[--nb] = n;
    return nb;
}

/* Builds the plan of `epoch` into ds->order / ds->batch_start. */
/* Entries for a plan: 2 n + 2 of them (the sort's two halves; the cut's
 * scratch and the batch order reuse the second). Fresh memory is what a start pays for at
 * millions of pairs (the kernel zeroes every page), so dataset_init hands
 * its own to the first plan. */
static uint64_t *plan_work(int n) { return pair_array((size_t)(2 * n + 2) * sizeof(uint64_t)); }

/* Builds the plan of `epoch` into ds->order / ds->batch_start; work (from
 * plan_work) is used and freed. */
static void build_plan_in(Dataset *ds, int64_t epoch, uint64_t *work) {
    const int n = ds->n_usable;
    uint64_t *ent = work, *tmp = work + n + 1;
    int32_t *scratch = pair_array((size_t)((n + 1) + ds->max_len + 2) * sizeof(int32_t));
    int32_t *bounds = scratch, *cnt = bounds + (n + 1);
    int32_t *dpbuf = (int32_t *)tmp;  // 2 (n + 1) int32 fit the n + 1 entries, free once sorted

    uint64_t rng = epoch_state(ds->cursor.seed, epoch);
    if (ds->epoch_files) {  // this epoch's samples: the same pairs, their own lengths
        const TokenFile *const *tfs = ds->epoch_files(ds->epoch_ctx, epoch);
        for (int k = 0; k < ds->n_tf; k++) ds->tfs[k] = tfs[k];
        ds->tf = ds->tfs[0];
        for (int i = 0; i < n; i++) {
            const int32_t p = ds->usable[i];
            ent[i] = (uint64_t)length_key((uint64_t)src_pieces(ds, p), (uint64_t)tgt_pieces(ds, p)) << 32 | (uint32_t)p;
        }
    } else {
        for (int i = 0; i < n; i++) ent[i] = (uint64_t)ds->usable_key[i] << 32 | (uint32_t)ds->usable[i];
    }
    shuffle_u64(ent, n, &rng);
    sort_by_length(ds, ent, tmp, cnt, n);
    int nb = cut_batches(ds, ent, n, ds->dp_size, bounds, dpbuf);

    uint64_t *perm = tmp;  // free again once cut: the batch order, nb <= n entries
    for (int b = 0; b < nb; b++) perm[b] = (uint64_t)b;
    shuffle_u64(perm, nb, &rng);
    int pos = 0;
    for (int k = 0; k < nb; k++) {
        int b = (int)perm[k], len = bounds[b + 1] - bounds[b];
        ds->batch_start[k] = pos;
        for (int i = 0; i < len; i++) ds->order[pos + i] = ent_pair(ent[bounds[b] + i]);
        pos += len;
    }
    ds->batch_start[nb] = pos;
    ds->n_batches = nb;
    ds->plan_epoch = epoch;
    free(scratch);
    free(work);
}

static void build_plan(Dataset *ds, int64_t epoch) { build_plan_in(ds, epoch, plan_work(ds->n_usable)); }

/* ---- batches ------------------------------------------------------------------- */

/* Fills out with the pairs pairs[0], pairs[stride], ... (B of them). */
static void fill_batch(const Dataset *ds, const int32_t *pairs, int B, int stride, OwnedBatch *out) {
    int S = 0, T = 0;
    for (int b = 0; b < B; b++) {
        int32_t p = pairs[(size_t)b * stride];
        int s = src_pieces(ds, p) + 1, t = tgt_pieces(ds, p) + 1;
        if (s > S) S = s;
        if (t > T) T = t;
    }
    S = bucketed(ds, S);
    T = bucketed(ds, T);
    owned_batch_alloc(out, B, S, T, ds->pad_id);
    for (int b = 0; b < B; b++) {
        int32_t p;
        const TokenFile *tf = pair_file(ds, pairs[(size_t)b * stride], &p);
        const int32_t *tok = tf->tokens;
        const uint64_t *so = src_off_of(ds, tf), *to = tgt_off_of(ds, tf);
        int ns = (int)(so[p + 1] - so[p]), nt = (int)(to[p + 1] - to[p]);
        int32_t *s = out->src + (size_t)b * S, *ti = out->tgt_in + (size_t)b * T, *tt = out->tgt_out + (size_t)b * T;
        memcpy(s, tok + so[p], (size_t)ns * sizeof(int32_t));
        s[ns] = ds->eos_id;
        ti[0] = ds->bos_id;
        memcpy(ti + 1, tok + to[p], (size_t)nt * sizeof(int32_t));
        memcpy(tt, tok + to[p], (size_t)nt * sizeof(int32_t));
        tt[nt] = ds->eos_id;
        out->src_len[b] = ns + 1;
        out->tgt_len[b] = nt + 1;
    }
}

void dataset_next(Dataset *ds, OwnedBatch *out, long *global_tokens) {
    dataset_next_micro(ds, 1, out, global_tokens);
}

void dataset_next_micro(Dataset *ds, int n_micro, OwnedBatch *out, long *global_tokens) {
    if (ds->plan_epoch != ds->cursor.epoch) build_plan(ds, ds->cursor.epoch);
    const int64_t g = ds->cursor.position;
    TP_CHECK(g >= 0 && g < ds->n_batches, "dataset cursor position %lld outside the epoch's %d batches",
             (long long)g, ds->n_batches);
    TP_CHECK(n_micro >= 1 && ds->dp_size % n_micro == 0 && ds->dp_rank < ds->dp_size / n_micro,
             "dataset: %d micro-batches do not divide its %d shares for rank %d", n_micro, ds->dp_size, ds->dp_rank);
    const int start = ds->batch_start[g], n = ds->batch_start[g + 1] - start;
    const int shares = ds->dp_size, dp = shares / n_micro;
    for (int i = 0; i < n_micro; i++) {
        const int r = ds->dp_rank + i * dp;
        const int B = (n - r + shares - 1) / shares;  // n >= shares, so B >= 1
        fill_batch(ds, ds->order + start + r, B, shares, &out[i]);
    }
    if (global_tokens) {
        long sum = 0;
        for (int j = 0; j < n; j++) sum += tgt_pieces(ds, ds->order[start + j]) + 1;
        *global_tokens = sum;
    }
    if (++ds->cursor.position == ds->n_batches) {
        ds->cursor.epoch++;
        ds->cursor.position = 0;
    }
}

/* Eval cut over the length-sorted `usable`: greedy with budget batch_tokens.
 * Returns the end of the batch starting at s. */
static int eval_batch_end(const Dataset *ds, int s) {
    int e = s + 1;
    while (e < ds->n_usable && (int64_t)(e - s + 1) * bucketed(ds, key_raw(ds->usable_key[e])) <= ds->batch_tokens)
        e++;
    return e;
}

int dataset_eval_batches(Dataset *ds) {
    int nb = 0;
    for (int s = 0; s < ds->n_usable; s = eval_batch_end(ds, s)) nb++;
    return nb;
}

void dataset_eval_batch(Dataset *ds, int i, OwnedBatch *out, int32_t *index) {
    TP_CHECK(i >= 0, "eval batch %d out of range", i);
    int s = 0;
    for (int k = 0; k < i && s < ds->n_usable; k++) s = eval_batch_end(ds, s);
    TP_CHECK(s < ds->n_usable, "eval batch %d out of range", i);
    int e = eval_batch_end(ds, s);
    fill_batch(ds, ds->usable + s, e - s, 1, out);
    if (index) memcpy(index, ds->usable + s, (size_t)(e - s) * sizeof(int32_t));
}

/* ---- setup and cursor ------------------------------------------------------------ */

int dataset_init(Dataset *ds, const TokenFile *tf, Direction dir, int max_len, int batch_tokens, int dp_rank,
                 int dp_size, uint64_t seed, int pad_id, int bos_id, int eos_id, char *err, size_t err_len) {
    const TokenFile *tfs[1] = {tf};
    return dataset_init_mix(ds, tfs, NULL, 1, dir, max_len, batch_tokens, dp_rank, dp_size, seed, pad_id, bos_id,
                            eos_id, err, err_len);
}

/* The arguments dataset_init_mix refuses; 0 or -1 + err. */
static int check_mix(const TokenFile *const *tfs, const int *copies, int n_tf, Direction dir, int max_len,
                     int batch_tokens, int dp_rank, int dp_size, char *err, size_t err_len) {
    if (n_tf < 1 || n_tf > DATASET_MAX_CORPORA) {
        tp_error_set(err, err_len, "dataset: %d corpora (1 to %d)", n_tf, DATASET_MAX_CORPORA);
        return -1;
    }
    int64_t total = 0;
    for (int k = 0; k < n_tf; k++) {
        const TokenFile *tf = tfs[k];
        if (!tf || tf->n_pairs < 0 || !tf->en_off || !tf->ja_off || (tf->n_tokens > 0 && !tf->tokens)) {
            tp_error_set(err, err_len, "dataset: no token file");
            return -1;
        }
        const int c = copies ? copies[k] : 1;
        if (c < 1 || c > DATASET_MAX_COPIES) {
            tp_error_set(err, err_len, "dataset: corpus %d is taken %d times an epoch (1 to %d)", k + 1, c,
                         DATASET_MAX_COPIES);
            return -1;
        }
        total += (int64_t)tf->n_pairs * c;
    }
    if (total > INT32_MAX - 1) {
        tp_error_set(err, err_len, "dataset: %lld pairs an epoch, more than %d", (long long)total, INT32_MAX - 1);
        return -1;
    }
    if (dir != DIR_EN_JA && dir != DIR_JA_EN) {
        tp_error_set(err, err_len, "dataset: unknown direction %d", (int)dir);
        return -1;
    }
    if (max_len < 2 || max_len > 65536) {
        tp_error_set(err, err_len, "dataset: max_len %d is outside 2..65536 (room for a piece and bos/eos; the "
                     "plan's 16-bit length keys)", max_len);
        return -1;
    }
    if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size) {
        tp_error_set(err, err_len, "dataset: dp_rank %d is outside 0..dp_size-1 (dp_size %d)", dp_rank, dp_size);
        return -1;
    }
    if (batch_tokens < 1) {
        tp_error_set(err, err_len, "dataset: batch_tokens %d must be positive", batch_tokens);
        return -1;
    }
    return 0;
}

int dataset_init_mix(Dataset *ds, const TokenFile *const *tfs, const int *copies, int n_tf, Direction dir,
                     int max_len, int batch_tokens, int dp_rank, int dp_size, uint64_t seed, int pad_id, int bos_id,
                     int eos_id, char *err, size_t err_len) {
    memset(ds, 0, sizeof *ds);
    ds->plan_epoch = -1;
    if (check_mix(tfs, copies, n_tf, dir, max_len, batch_tokens, dp_rank, dp_size, err, err_len) != 0) return -1;
    *ds = (Dataset){.tf = tfs[0], .n_tf = n_tf, .dir = dir, .max_len = max_len, .batch_tokens = batch_tokens,
                    .dp_rank = dp_rank, .dp_size = dp_size, .pad_id = pad_id, .bos_id = bos_id, .eos_id = eos_id,
                    .plan_epoch = -1, .length_bucket = 1,
                    .cursor = (DataCursor){.seed = seed, .epoch = 0, .position = 0}};
    int64_t total = 0;
    for (int k = 0; k < n_tf; k++) {
        ds->tfs[k] = tfs[k];
        ds->copies[k] = copies ? copies[k] : 1;
        ds->first[k] = (int32_t)(k ? ds->first[k - 1] + tfs[k - 1]->n_pairs : 0);
        total += (int64_t)tfs[k]->n_pairs * ds->copies[k];
    }
    ds->first[n_tf] = ds->first[n_tf - 1] + tfs[n_tf - 1]->n_pairs;
    for (int k = n_tf + 1; k <= DATASET_MAX_CORPORA; k++) ds->first[k] = INT32_MAX;

    /* Usable pairs: both sides 1..max_len-1 pieces, each corpus's taken
     * copies[k] times (adjacent). A side over the limit counts as too long
     * (once); an empty side (the corpus step drops those) is skipped
     * without being counted. One pass over the offsets checks them and
     * makes the sort's entries. */
    uint64_t *ent = plan_work((int)total);
    const uint64_t limit = (uint64_t)max_len - 1;
    int n = 0, longest = 0, n_pairs = 0;
    for (int k = 0; k < n_tf; k++) {
        const TokenFile *tf = tfs[k];
        const uint64_t *so = src_off_of(ds, tf), *to = tgt_off_of(ds, tf);
        n_pairs += tf->n_pairs;
        for (int i = 0; i < tf->n_pairs; i++) {
            if (so[i] > so[i + 1] || to[i] > to[i + 1] || so[i + 1] > tf->n_tokens || to[i + 1] > tf->n_tokens) {
                tp_error_set(err, err_len, "dataset: token offsets of pair %d are out of order or out of range", i);
                free(ent);
                memset(ds, 0, sizeof *ds);
                return -1;
            }
            const uint64_t ls = so[i + 1] - so[i], lt = to[i + 1] - to[i];
            if (ls > limit || lt > limit) {
                ds->n_too_long++;
                continue;
            }
            if (ls == 0 || lt == 0) continue;
            const int raw = (int)(ls > lt ? ls : lt) + 1;
            const uint64_t e = (uint64_t)length_key(ls, lt) << 32 | (uint32_t)(ds->first[k] + i);
            for (int c = 0; c < ds->copies[k]; c++) ent[n++] = e;
            if (bucketed(ds, raw) > longest) longest = bucketed(ds, raw);
        }
    }
    if (n == 0 || n < dp_size || longest > batch_tokens) {
        if (longest > batch_tokens)
            tp_error_set(err, err_len, "dataset: batch_tokens %d is smaller than the longest usable pair (%d tokens)",
                         batch_tokens, longest);
        else
            tp_error_set(err, err_len,
                         "dataset: %d usable pairs (of %d; %ld too long for max_len %d) cannot feed %d data-parallel "
                         "rank(s)",
                         n, n_pairs, ds->n_too_long, max_len, dp_size);
        free(ent);
        memset(ds, 0, sizeof *ds);
        return -1;
    }
    ds->n_usable = n;
    ds->order = pair_array((size_t)n * sizeof(int32_t));
    ds->batch_start = pair_array((size_t)(n + 1) * sizeof(int32_t));
    /* usable is kept in eval order: length-sorted, ties by pair index, its keys beside it. */
    int32_t *cnt = TP_MALLOC((size_t)(max_len + 2) * sizeof(int32_t));
    sort_by_length(ds, ent, ent + n + 1, cnt, n);
    ds->usable = pair_array((size_t)n * sizeof(int32_t));
    ds->usable_key = pair_array((size_t)n * sizeof(uint32_t));
    for (int i = 0; i < n; i++) ds->usable[i] = ent_pair(ent[i]), ds->usable_key[i] = (uint32_t)(ent[i] >> 32);
    free(cnt);
    build_plan_in(ds, 0, ent);
    return 0;
}

int dataset_set_length_bucket(Dataset *ds, int n, char *err, size_t err_len) {
    if (n < 1 || n > (1 << 20)) {
        tp_error_set(err, err_len, "dataset: length bucket %d must be 1 or more", n);
        return -1;
    }
    const int old = ds->length_bucket;
    if (n == old) return 0;  // the plan already has these lengths
    ds->length_bucket = n;
    int longest = 0;
    for (int i = 0; i < ds->n_usable; i++) {
        int m = bucketed(ds, key_raw(ds->usable_key[i]));
        if (m > longest) longest = m;
    }
    if (longest > ds->batch_tokens) {
        tp_error_set(err, err_len,
                     "dataset: batch_tokens %d is smaller than the longest usable pair padded to a multiple of %d "
                     "(%d tokens)", ds->batch_tokens, n, longest);
        ds->length_bucket = old;
        return -1;
    }
    build_plan(ds, ds->cursor.epoch);  // the cut depends on the padded lengths
    return 0;
}

int dataset_max_pieces(const Dataset *ds) {
    int n = ds->max_len - 1;
    while (n > 1 && bucketed(ds, n + 1) > ds->batch_tokens) n--;
    return n;
}

void dataset_set_epoch_files(Dataset *ds, const TokenFile *const *(*files)(void *ctx, int64_t epoch), void *ctx) {
    ds->epoch_files = files;
    ds->epoch_ctx = ctx;
    build_plan(ds, ds->cursor.epoch);
}

void dataset_free(Dataset *ds) {
    free(ds->usable);
    free(ds->usable_key);
    free(ds->order);
    free(ds->batch_start);
    memset(ds, 0, sizeof *ds);
}

DataCursor dataset_cursor(const Dataset *ds) { return ds->cursor; }

int dataset_seek(Dataset *ds, DataCursor c, char *err, size_t err_len) {
    if (c.seed != ds->cursor.seed) {
        tp_error_set(err, err_len, "dataset: the saved data order has seed %llu but this run uses seed %llu",
                     (unsigned long long)c.seed, (unsigned long long)ds->cursor.seed);
        return -1;
    }
    if (c.epoch < 0 || c.position < 0) {
        tp_error_set(err, err_len, "dataset: invalid saved position (epoch %lld, batch %lld)", (long long)c.epoch,
                     (long long)c.position);
        return -1;
    }
    if (ds->plan_epoch != c.epoch) build_plan(ds, c.epoch);
    if (c.position > ds->n_batches) {
        tp_error_set(err, err_len,
                     "dataset: saved position (epoch %lld, batch %lld) is beyond the epoch's %d batches; was the "
                     "data, max_len, batch_tokens, length bucket or dp size changed?",
                     (long long)c.epoch, (long long)c.position, ds->n_batches);
        return -1;
    }
    ds->cursor = c;
    if (c.position == ds->n_batches) {
        ds->cursor.epoch++;
        ds->cursor.position = 0;
    }
    return 0;
}

int direction_parse(const char *s, Direction *d) {
    if (strcmp(s, "en-ja") == 0) { *d = DIR_EN_JA; return 0; }
    if (strcmp(s, "ja-en") == 0) { *d = DIR_JA_EN; return 0; }
    return -1;
}
