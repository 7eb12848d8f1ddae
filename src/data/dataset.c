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

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

static const uint64_t *src_off(const Dataset *ds) { return ds->dir == DIR_EN_JA ? ds->tf->en_off : ds->tf->ja_off; }
static const uint64_t *tgt_off(const Dataset *ds) { return ds->dir == DIR_EN_JA ? ds->tf->ja_off : ds->tf->en_off; }

/* Pieces of each side; only called for usable pairs (fit in int). */
static int src_pieces(const Dataset *ds, int32_t p) {
    const uint64_t *o = src_off(ds);
    return (int)(o[p + 1] - o[p]);
}
static int tgt_pieces(const Dataset *ds, int32_t p) {
    const uint64_t *o = tgt_off(ds);
    return (int)(o[p + 1] - o[p]);
}
/* A length padded up to the bucket: a multiple of length_bucket, at most
 * max_len (which every usable side fits). */
static int bucketed(const Dataset *ds, int len) {
    const int n = ds->length_bucket > 1 ? ds->length_bucket : 1;
    const int up = (len + n - 1) / n * n;
    return up < ds->max_len ? up : (len > ds->max_len ? len : ds->max_len);
}
/* Longest side of a pair, unbucketed: max(src + eos, bos + tgt). The sort key. */
static int raw_len(const Dataset *ds, int32_t p) {
    int s = src_pieces(ds, p), t = tgt_pieces(ds, p);
    return (s > t ? s : t) + 1;
}
/* The pair's padded side in a batch: raw_len bucketed (monotone in raw_len,
 * so the length-sorted order is also sorted by it). */
static int padded_len(const Dataset *ds, int32_t p) { return bucketed(ds, raw_len(ds, p)); }

/* ---- the per-epoch generator -------------------------------------------------- */

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t epoch_state(uint64_t seed, int64_t epoch) {
    uint64_t a = seed ^ 0x6A09E667F3BCC908ull, b = (uint64_t)epoch ^ 0xBB67AE8584CAA73Bull;
    uint64_t ka = splitmix64(&a), kb = splitmix64(&b);
    return ka ^ (kb * 0xD1B54A32D192ED03ull);
}

/* Uniform in [0, n); the modulo bias (n / 2^64) is far below any effect. */
static uint64_t below(uint64_t *state, uint64_t n) { return splitmix64(state) % n; }

static void shuffle_i32(int32_t *a, int n, uint64_t *state) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)below(state, (uint64_t)i + 1);
        int32_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* The same permutation on entries (the same draws in the same order). The
 * draws do not depend on the array, so a block of them is made first and
 * the entries they will touch are fetched ahead: at millions of entries
 * each swap would otherwise wait for memory in turn. */
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

/* A usable pair's sort key, (raw_len - 1) << 16 | source pieces (both
 * below 2^16 for max_len <= 65536), carried beside the pair's
 * index in the plan's entries (key << 32 | index), so sorting and cutting
 * read no offsets: at millions of pairs those reads, scattered over the
 * token file's tables, were most of a start's batching time. */
static uint32_t sort_key(const Dataset *ds, int32_t p) {
    return (uint32_t)(raw_len(ds, p) - 1) << 16 | (uint32_t)src_pieces(ds, p);
}
static int key_raw(uint32_t k) { return (int)(k >> 16) + 1; }
static int ent_raw(uint64_t e) { return key_raw((uint32_t)(e >> 32)); }
static int ent_src(uint64_t e) { return (int)(e >> 32 & 0xFFFF); }
static int32_t ent_pair(uint64_t e) { return (int32_t)(uint32_t)e; }

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
static void build_plan(Dataset *ds, int64_t epoch) {
    const int n = ds->n_usable;
    uint64_t *ent = pair_array((size_t)(2 * n + 1) * sizeof(uint64_t)), *tmp = ent + n;
    int32_t *scratch = pair_array((size_t)(4 * (n + 1) + ds->max_len + 2) * sizeof(int32_t));
    int32_t *bounds = scratch, *dpbuf = bounds + (n + 1), *cnt = dpbuf + 2 * (n + 1);
    int32_t *perm = cnt + ds->max_len + 2;

    uint64_t rng = epoch_state(ds->cursor.seed, epoch);
    for (int i = 0; i < n; i++) ent[i] = (uint64_t)ds->usable_key[i] << 32 | (uint32_t)ds->usable[i];
    shuffle_u64(ent, n, &rng);
    sort_by_length(ds, ent, tmp, cnt, n);
    int nb = cut_batches(ds, ent, n, ds->dp_size, bounds, dpbuf);

    for (int b = 0; b < nb; b++) perm[b] = b;
    shuffle_i32(perm, nb, &rng);
    int pos = 0;
    for (int k = 0; k < nb; k++) {
        int b = perm[k], len = bounds[b + 1] - bounds[b];
        ds->batch_start[k] = pos;
        for (int i = 0; i < len; i++) ds->order[pos + i] = ent_pair(ent[bounds[b] + i]);
        pos += len;
    }
    ds->batch_start[nb] = pos;
    ds->n_batches = nb;
    ds->plan_epoch = epoch;
    free(scratch);
    free(ent);
}

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
    const int32_t *tok = ds->tf->tokens;
    const uint64_t *so = src_off(ds), *to = tgt_off(ds);
    for (int b = 0; b < B; b++) {
        int32_t p = pairs[(size_t)b * stride];
        int ns = src_pieces(ds, p), nt = tgt_pieces(ds, p);
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
    memset(ds, 0, sizeof *ds);
    ds->plan_epoch = -1;
    if (!tf || tf->n_pairs < 0 || !tf->en_off || !tf->ja_off || (tf->n_tokens > 0 && !tf->tokens)) {
        tp_error_set(err, err_len, "dataset: no token file");
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
    for (int i = 0; i < tf->n_pairs; i++) {
        if (tf->en_off[i] > tf->en_off[i + 1] || tf->ja_off[i] > tf->ja_off[i + 1] ||
            tf->en_off[i + 1] > tf->n_tokens || tf->ja_off[i + 1] > tf->n_tokens) {
            tp_error_set(err, err_len, "dataset: token offsets of pair %d are out of order or out of range", i);
            return -1;
        }
    }
    *ds = (Dataset){.tf = tf, .dir = dir, .max_len = max_len, .batch_tokens = batch_tokens, .dp_rank = dp_rank,
                    .dp_size = dp_size, .pad_id = pad_id, .bos_id = bos_id, .eos_id = eos_id, .plan_epoch = -1,
                    .length_bucket = 1, .cursor = (DataCursor){.seed = seed, .epoch = 0, .position = 0}};

    /* Usable pairs: both sides 1..max_len-1 pieces. A side over the limit
     * counts as too long; an empty side (the corpus step drops those) is
     * skipped without being counted. */
    int32_t *all = pair_array((size_t)(tf->n_pairs > 0 ? tf->n_pairs : 1) * sizeof(int32_t));
    const uint64_t *so = src_off(ds), *to = tgt_off(ds);
    const uint64_t limit = (uint64_t)max_len - 1;
    int n = 0, longest = 0;
    for (int i = 0; i < tf->n_pairs; i++) {
        uint64_t ls = so[i + 1] - so[i], lt = to[i + 1] - to[i];
        if (ls > limit || lt > limit) {
            ds->n_too_long++;
            continue;
        }
        if (ls == 0 || lt == 0) continue;
        all[n++] = i;
        int m = padded_len(ds, i);
        if (m > longest) longest = m;
    }
    if (n == 0 || n < dp_size) {
        tp_error_set(err, err_len,
                     "dataset: %d usable pairs (of %d; %ld too long for max_len %d) cannot feed %d data-parallel "
                     "rank(s)",
                     n, tf->n_pairs, ds->n_too_long, max_len, dp_size);
        free(all);
        memset(ds, 0, sizeof *ds);
        return -1;
    }
    if (longest > batch_tokens) {
        tp_error_set(err, err_len, "dataset: batch_tokens %d is smaller than the longest usable pair (%d tokens)",
                     batch_tokens, longest);
        free(all);
        memset(ds, 0, sizeof *ds);
        return -1;
    }
    ds->n_usable = n;
    ds->usable = all;
    ds->order = pair_array((size_t)n * sizeof(int32_t));
    ds->batch_start = pair_array((size_t)(n + 1) * sizeof(int32_t));
    /* usable is kept in eval order: length-sorted, ties by pair index, its keys beside it. */
    uint64_t *ent = pair_array((size_t)(2 * n) * sizeof(uint64_t));
    int32_t *cnt = TP_MALLOC((size_t)(max_len + 2) * sizeof(int32_t));
    for (int i = 0; i < n; i++) ent[i] = (uint64_t)sort_key(ds, all[i]) << 32 | (uint32_t)all[i];
    sort_by_length(ds, ent, ent + n, cnt, n);
    ds->usable_key = pair_array((size_t)n * sizeof(uint32_t));
    for (int i = 0; i < n; i++) ds->usable[i] = ent_pair(ent[i]), ds->usable_key[i] = (uint32_t)(ent[i] >> 32);
    free(cnt);
    free(ent);
    build_plan(ds, 0);
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
