/* test_dataset.c: batching of token pairs for data-parallel training.
 *
 * Token files are built in memory. Every token is a known function of
 * (side, pair, position) and a side's first token names its pair, so each
 * row of a batch can be decoded back to its pair and checked token by token.
 * All dp ranks are simulated by separate Dataset objects with one seed. */
#define _POSIX_C_SOURCE 200809L

#include "check.h"
#include "clock.h"
#include "data/dataset.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { PAD = 0, BOS = 2, EOS = 3 };
enum { EN_BASE = 1000000, JA_BASE = 2000000 };

/* Token t of side (0 en, 1 ja) of pair i. */
static int32_t tokval(int side, int i, int t) {
    if (t == 0) return (side ? JA_BASE : EN_BASE) + i;
    return 4 + (int32_t)(((uint32_t)i * 131u + (uint32_t)t * 17u + (uint32_t)side * 7u) % 5000u);
}

typedef struct {
    TokenFile tf;
    int n;
    int *len[2];          // (n) pieces of en, ja
    uint64_t *off[2];     // (n + 1)
    uint32_t *line;       // (n)
    int32_t *tokens;
} Fixture;

static void fixture_build(Fixture *fx, int n, const int *en_len, const int *ja_len) {
    memset(fx, 0, sizeof *fx);
    fx->n = n;
    for (int s = 0; s < 2; s++) {
        fx->len[s] = malloc((size_t)n * sizeof(int));
        fx->off[s] = malloc((size_t)(n + 1) * sizeof(uint64_t));
    }
    memcpy(fx->len[0], en_len, (size_t)n * sizeof(int));
    memcpy(fx->len[1], ja_len, (size_t)n * sizeof(int));
    uint64_t total = 0;
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < n; i++) total += (uint64_t)fx->len[s][i];
    fx->tokens = malloc((size_t)(total > 0 ? total : 1) * sizeof(int32_t));
    fx->line = malloc((size_t)(n > 0 ? n : 1) * sizeof(uint32_t));
    uint64_t pos = 0;
    for (int s = 0; s < 2; s++) {  // all English first, then all Japanese
        for (int i = 0; i < n; i++) {
            fx->off[s][i] = pos;
            for (int t = 0; t < fx->len[s][i]; t++) fx->tokens[pos++] = tokval(s, i, t);
        }
        fx->off[s][n] = pos;
    }
    for (int i = 0; i < n; i++) fx->line[i] = (uint32_t)i + 1;
    fx->tf = (TokenFile){.n_pairs = n, .en_off = fx->off[0], .ja_off = fx->off[1], .line = fx->line,
                         .tokens = fx->tokens, .n_tokens = total, .map = NULL, .map_bytes = 0};
}

static void fixture_free(Fixture *fx) {
    for (int s = 0; s < 2; s++) {
        free(fx->len[s]);
        free(fx->off[s]);
    }
    free(fx->line);
    free(fx->tokens);
    memset(fx, 0, sizeof *fx);
}

static uint64_t g_rng = 0x243F6A8885A308D3ull;
static uint32_t rnd(uint32_t n) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng % n);
}

static bool usable(const Fixture *fx, int i, int max_len) {
    return fx->len[0][i] >= 1 && fx->len[1][i] >= 1 && fx->len[0][i] <= max_len - 1 && fx->len[1][i] <= max_len - 1;
}
static long count_too_long(const Fixture *fx, int max_len) {
    long c = 0;
    for (int i = 0; i < fx->n; i++) c += fx->len[0][i] > max_len - 1 || fx->len[1][i] > max_len - 1;
    return c;
}
static int count_usable(const Fixture *fx, int max_len) {
    int c = 0;
    for (int i = 0; i < fx->n; i++) c += usable(fx, i, max_len);
    return c;
}

/* Checks every row of b token by token; pairs[b] receives row b's pair
 * (-1 when undecodable). Returns the number of failed rows. */
/* A length padded up to a multiple of bucket, at most max_len: what a batch's S and T must be. */
static int bucket_up(int len, int bucket, int max_len) {
    int up = (len + bucket - 1) / bucket * bucket;
    return up < max_len ? up : max_len;
}

static int verify_batch_b(const Fixture *fx, Direction dir, int max_len, int bucket, const Batch *b, int32_t *pairs) {
    const int ss = dir == DIR_EN_JA ? 0 : 1, ts = 1 - ss;
    const int base = ss == 0 ? EN_BASE : JA_BASE;
    int bad = 0, max_s = 0, max_t = 0;
    for (int r = 0; r < b->B; r++) {
        const int32_t *src = b->src + (size_t)r * b->S, *ti = b->tgt_in + (size_t)r * b->T,
                      *to = b->tgt_out + (size_t)r * b->T;
        int p = src[0] - base;
        pairs[r] = -1;
        if (p < 0 || p >= fx->n || !usable(fx, p, max_len)) {
            bad++;
            continue;
        }
        pairs[r] = p;
        const int ns = fx->len[ss][p], nt = fx->len[ts][p];
        bool ok = b->src_len[r] == ns + 1 && b->tgt_len[r] == nt + 1 && ns + 1 <= b->S && nt + 1 <= b->T;
        if (ok) {
            for (int t = 0; t < ns; t++) ok &= src[t] == tokval(ss, p, t);
            ok &= src[ns] == EOS;
            for (int t = ns + 1; t < b->S; t++) ok &= src[t] == PAD;
            ok &= ti[0] == BOS;
            for (int t = 0; t < nt; t++) ok &= ti[t + 1] == tokval(ts, p, t) && to[t] == tokval(ts, p, t);
            ok &= to[nt] == EOS;
            for (int t = nt + 1; t < b->T; t++) ok &= ti[t] == PAD && to[t] == PAD;
        }
        if (!ok) bad++;
        if (ns + 1 > max_s) max_s = ns + 1;
        if (nt + 1 > max_t) max_t = nt + 1;
    }
    const int want_s = bucket_up(max_s, bucket, max_len), want_t = bucket_up(max_t, bucket, max_len);
    CHECK(b->S == want_s && b->T == want_t, "S %d T %d, longest rows %d %d, bucket %d: want %d %d", b->S, b->T, max_s,
          max_t, bucket, want_s, want_t);
    CHECK(bad == 0, "%d bad rows of %d", bad, b->B);
    return bad;
}
static int verify_batch(const Fixture *fx, Direction dir, int max_len, const Batch *b, int32_t *pairs) {
    return verify_batch_b(fx, dir, max_len, 1, b, pairs);
}

static long tgt_tokens(const Batch *b) {
    long s = 0;
    for (int r = 0; r < b->B; r++) s += b->tgt_len[r];
    return s;
}

static int padded(const Batch *b) { return b->B * (b->S > b->T ? b->S : b->T); }

/* One epoch over all dp ranks: coverage, budget, cursors, global tokens. */
static void check_epoch_b(const Fixture *fx, Direction dir, int max_len, int dp, int budget, uint64_t seed,
                          int bucket) {
    Dataset ds[8];
    char err[256];
    for (int r = 0; r < dp; r++) {
        err[0] = 0;
        int rc = dataset_init(&ds[r], &fx->tf, dir, max_len, budget, r, dp, seed, PAD, BOS, EOS, err, sizeof err);
        if (rc == 0 && bucket > 1) rc = dataset_set_length_bucket(&ds[r], bucket, err, sizeof err);
        CHECK(rc == 0, "init dp %d rank %d budget %d bucket %d: %s", dp, r, budget, bucket, err);
        if (rc != 0) return;
    }
    CHECK(ds[0].n_usable == count_usable(fx, max_len), "n_usable %d want %d", ds[0].n_usable,
          count_usable(fx, max_len));
    CHECK(ds[0].n_too_long == count_too_long(fx, max_len), "n_too_long %ld want %ld", ds[0].n_too_long,
          count_too_long(fx, max_len));
    const int nb = ds[0].n_batches;
    for (int r = 1; r < dp; r++) CHECK(ds[r].n_batches == nb, "rank %d has %d batches, rank 0 %d", r, ds[r].n_batches, nb);
    CHECK(nb >= 1 && nb <= ds[0].n_usable / dp, "%d batches for %d pairs, dp %d", nb, ds[0].n_usable, dp);

    int *seen = calloc((size_t)fx->n, sizeof(int));
    int32_t *pairs = malloc((size_t)fx->n * sizeof(int32_t));
    int over_budget = 0, unsorted = 0, bad_cursor = 0, bad_tokens = 0, bad_b = 0, bad_shape = 0, bad_pad = 0;
    long padded_sum = 0, real_sum = 0;
    for (int step = 0; step < nb; step++) {
        long global[8], sum = 0;
        int B0 = 0;
        for (int r = 0; r < dp; r++) {
            OwnedBatch ob;
            dataset_next(&ds[r], &ob, &global[r]);
            const Batch *b = &ob.view;
            verify_batch_b(fx, dir, max_len, bucket, b, pairs);
            if ((b->S % bucket && b->S != max_len) || (b->T % bucket && b->T != max_len)) bad_shape++;
            long real_slots = 0;
            for (int i = 0; i < b->B; i++) real_slots += b->src_len[i] + b->tgt_len[i];
            const double want_pad = 1.0 - (double)real_slots / ((double)b->B * (b->S + b->T));
            if (fabs(batch_pad_fraction(b) - want_pad) > 1e-12) bad_pad++;
            if (r == 0) B0 = b->B;
            if (b->B < 1 || b->B > B0 || b->B < B0 - 1) bad_b++;
            if (padded(b) > budget) over_budget++;
            padded_sum += padded(b);
            for (int i = 0; i < b->B; i++) {
                if (pairs[i] >= 0) seen[pairs[i]]++;
                int m = b->src_len[i] > b->tgt_len[i] ? b->src_len[i] : b->tgt_len[i];
                real_sum += m;
                if (i > 0) {  // rows follow the length sort: (padded length, source length)
                    int mp = b->src_len[i - 1] > b->tgt_len[i - 1] ? b->src_len[i - 1] : b->tgt_len[i - 1];
                    if (m < mp || (m == mp && b->src_len[i] < b->src_len[i - 1])) unsorted++;
                }
            }
            sum += tgt_tokens(b);
            DataCursor c = dataset_cursor(&ds[r]);
            int64_t we = step + 1 < nb ? 0 : 1, wp = step + 1 < nb ? step + 1 : 0;
            if (c.epoch != we || c.position != wp || c.seed != seed) bad_cursor++;
            owned_batch_free(&ob);
        }
        for (int r = 0; r < dp; r++)
            if (global[r] != sum) bad_tokens++;
    }
    CHECK(over_budget == 0, "dp %d budget %d: %d batches over the per-rank budget", dp, budget, over_budget);
    CHECK(unsorted == 0, "dp %d budget %d: %d rows out of length order", dp, budget, unsorted);
    CHECK(bad_cursor == 0, "dp %d budget %d: %d wrong cursors", dp, budget, bad_cursor);
    CHECK(bad_tokens == 0, "dp %d budget %d: %d global_tokens differ from the ranks' sum", dp, budget, bad_tokens);
    CHECK(bad_b == 0, "dp %d budget %d: %d uneven rank shares", dp, budget, bad_b);
    CHECK(bad_shape == 0, "dp %d budget %d bucket %d: %d batches with a length not a multiple of the bucket", dp,
          budget, bucket, bad_shape);
    CHECK(bad_pad == 0, "dp %d budget %d: %d batches with a wrong padding fraction", dp, budget, bad_pad);
    int missing = 0, twice = 0, leaked = 0;
    for (int i = 0; i < fx->n; i++) {
        if (usable(fx, i, max_len)) {
            missing += seen[i] == 0;
            twice += seen[i] > 1;
        } else {
            leaked += seen[i] != 0;
        }
    }
    CHECK(missing == 0 && twice == 0 && leaked == 0,
          "dp %d budget %d dir %d: %d pairs missing, %d seen twice, %d unusable seen", dp, budget, (int)dir, missing,
          twice, leaked);
    /* Length bucketing keeps padding small once batches hold many rows. */
    if (budget >= 500 && bucket == 1)
        CHECK((double)padded_sum <= 1.25 * (double)real_sum, "dp %d budget %d: padding %ld of %ld tokens", dp,
              budget, padded_sum, real_sum);
    free(seen);
    free(pairs);
    for (int r = 0; r < dp; r++) dataset_free(&ds[r]);
}

static void check_epoch(const Fixture *fx, Direction dir, int max_len, int dp, int budget, uint64_t seed) {
    check_epoch_b(fx, dir, max_len, dp, budget, seed, 1);
}

/* --length-bucket: every epoch check holds with bucketed shapes (multiples
 * of the bucket, or max_len when the bucket does not divide it), evaluation
 * batches are bucketed too, and a budget below the longest bucketed pair is
 * refused by name. */
static void check_buckets(const Fixture *fx, int max_len) {
    const int budgets[] = {64, 100, 400, 1500};
    for (int dp = 1; dp <= 3; dp++)
        for (size_t k = 0; k < sizeof budgets / sizeof budgets[0]; k++) {
            check_epoch_b(fx, DIR_EN_JA, max_len, dp, budgets[k], 300 + (uint64_t)dp, 8);
            check_epoch_b(fx, DIR_JA_EN, max_len, dp, budgets[k], 300 + (uint64_t)dp, 5);  // 5 does not divide 32
        }
    check_epoch_b(fx, DIR_EN_JA, max_len, 2, 300, 9, 1);  // bucket 1 is the plain cut
    Dataset d, plain;
    char err[256];
    CHECK(dataset_init(&d, &fx->tf, DIR_EN_JA, max_len, 200, 0, 1, 5, PAD, BOS, EOS, err, sizeof err) == 0, "%s", err);
    CHECK(dataset_init(&plain, &fx->tf, DIR_EN_JA, max_len, 200, 0, 1, 5, PAD, BOS, EOS, err, sizeof err) == 0, "%s",
          err);
    CHECK(dataset_set_length_bucket(&d, 8, err, sizeof err) == 0, "%s", err);
    int32_t *pairs = malloc((size_t)fx->n * sizeof(int32_t)), bad_eval = 0;
    const int ne = dataset_eval_batches(&d);
    for (int i = 0; i < ne; i++) {
        OwnedBatch ob;
        dataset_eval_batch(&d, i, &ob, NULL);
        verify_batch_b(fx, DIR_EN_JA, max_len, 8, &ob.view, pairs);
        bad_eval += padded(&ob.view) > 200;
        owned_batch_free(&ob);
    }
    CHECK(bad_eval == 0, "%d bucketed eval batches over the budget", bad_eval);
    /* padding to 8 costs slots: fewer pairs fit a batch, so at least as many batches */
    CHECK(d.n_batches >= plain.n_batches, "bucketed epoch has %d batches, plain %d", d.n_batches, plain.n_batches);
    err[0] = 0;
    CHECK(dataset_set_length_bucket(&d, 0, err, sizeof err) == -1 && strstr(err, "bucket 0"), "bucket 0: '%s'", err);
    dataset_free(&d);
    dataset_free(&plain);
    /* A budget that holds the longest pair (6 tokens) but not its bucketed length (8) is refused by name,
     * and the refusal leaves the plain cut in place. */
    const int en3[] = {5, 3, 2}, ja3[] = {4, 4, 1};
    Fixture small;
    fixture_build(&small, 3, en3, ja3);
    CHECK(dataset_init(&d, &small.tf, DIR_EN_JA, 16, 6, 0, 1, 5, PAD, BOS, EOS, err, sizeof err) == 0, "%s", err);
    err[0] = 0;
    CHECK(dataset_set_length_bucket(&d, 4, err, sizeof err) == -1 && strstr(err, "multiple of 4") &&
              strstr(err, "8 tokens"), "bucket 4 over a budget of 6: '%s'", err);
    CHECK(d.length_bucket == 1, "a refused bucket stayed set (%d)", d.length_bucket);
    CHECK(dataset_set_length_bucket(&d, 3, err, sizeof err) == 0, "bucket 3 (6 tokens) refused: %s", err);
    OwnedBatch ob;
    dataset_next(&d, &ob, NULL);
    CHECK(ob.view.S % 3 == 0 && ob.view.T % 3 == 0 && ob.view.B == 1, "bucket 3: batch %dx%d/%d", ob.view.B,
          ob.view.S, ob.view.T);
    owned_batch_free(&ob);
    dataset_free(&d);
    fixture_free(&small);
    free(pairs);
}

/* Pair ids of one epoch in visiting order (dp 1); returns the count.
 * mate[p] (if non-NULL, indexed by pair) receives the smallest pair id in
 * p's batch, a label of the batch's composition. */
static int epoch_sequence(Dataset *ds, int32_t *seq, int *batch_max, int *n_batches, int32_t *mate) {
    int n = 0, k = 0;
    const int64_t e = dataset_cursor(ds).epoch;
    const int base = ds->dir == DIR_EN_JA ? EN_BASE : JA_BASE;
    while (dataset_cursor(ds).epoch == e) {
        OwnedBatch ob;
        dataset_next(ds, &ob, NULL);
        int32_t low = INT32_MAX;
        for (int r = 0; r < ob.view.B; r++) {
            seq[n + r] = ob.view.src[(size_t)r * ob.view.S] - base;
            if (seq[n + r] < low) low = seq[n + r];
        }
        if (mate)
            for (int r = 0; r < ob.view.B; r++) mate[seq[n + r]] = low;
        n += ob.view.B;
        if (batch_max) batch_max[k] = ob.view.S > ob.view.T ? ob.view.S : ob.view.T;
        k++;
        owned_batch_free(&ob);
    }
    if (n_batches) *n_batches = k;
    return n;
}

static void check_order(const Fixture *fx, int max_len) {
    Dataset a, b, c;
    char err[256];
    CHECK(dataset_init(&a, &fx->tf, DIR_EN_JA, max_len, 200, 0, 1, 7, PAD, BOS, EOS, err, sizeof err) == 0, "%s", err);
    CHECK(dataset_init(&b, &fx->tf, DIR_EN_JA, max_len, 200, 0, 1, 7, PAD, BOS, EOS, err, sizeof err) == 0, "%s", err);
    CHECK(dataset_init(&c, &fx->tf, DIR_EN_JA, max_len, 200, 0, 1, 8, PAD, BOS, EOS, err, sizeof err) == 0, "%s", err);
    const int n = a.n_usable;
    int32_t *e0 = malloc((size_t)n * sizeof *e0), *e1 = malloc((size_t)n * sizeof *e1);
    int32_t *s0 = malloc((size_t)n * sizeof *s0), *o0 = malloc((size_t)n * sizeof *o0);
    int *bmax = malloc((size_t)n * sizeof *bmax), nb = 0;
    int32_t *m0 = calloc((size_t)fx->n, sizeof *m0), *m1 = calloc((size_t)fx->n, sizeof *m1);
    CHECK(epoch_sequence(&a, e0, bmax, &nb, m0) == n, "epoch 0 length");
    CHECK(epoch_sequence(&a, e1, NULL, NULL, m1) == n, "epoch 1 length");
    CHECK(epoch_sequence(&b, s0, NULL, NULL, NULL) == n, "same-seed length");
    CHECK(epoch_sequence(&c, o0, NULL, NULL, NULL) == n, "other-seed length");
    /* Pairs of equal length are shuffled too: batches change composition. */
    int regrouped = 0;
    for (int i = 0; i < fx->n; i++) regrouped += usable(fx, i, max_len) && m0[i] != m1[i];
    CHECK(regrouped > n / 4, "only %d of %d pairs changed batch mates between epochs", regrouped, n);
    free(m0);
    free(m1);
    CHECK(memcmp(e0, e1, (size_t)n * sizeof *e0) != 0, "epochs 0 and 1 have the same order");
    CHECK(memcmp(e0, s0, (size_t)n * sizeof *e0) == 0, "the same seed gave another order");
    CHECK(memcmp(e0, o0, (size_t)n * sizeof *e0) != 0, "another seed gave the same order");
    /* The batch order is shuffled, not left sorted by length. */
    int descents = 0;
    for (int k = 1; k < nb; k++) descents += bmax[k] < bmax[k - 1];
    CHECK(nb > 10 && descents > nb / 10, "%d descents in %d batch lengths: batch order not shuffled", descents, nb);
    free(e0);
    free(e1);
    free(s0);
    free(o0);
    free(bmax);
    dataset_free(&a);
    dataset_free(&b);
    dataset_free(&c);
}

static bool same_batch(const Batch *x, const Batch *y) {
    if (x->B != y->B || x->S != y->S || x->T != y->T) return false;
    size_t bs = (size_t)x->B * x->S * sizeof(int32_t), bt = (size_t)x->B * x->T * sizeof(int32_t);
    return memcmp(x->src, y->src, bs) == 0 && memcmp(x->tgt_in, y->tgt_in, bt) == 0 &&
           memcmp(x->tgt_out, y->tgt_out, bt) == 0 &&
           memcmp(x->src_len, y->src_len, (size_t)x->B * sizeof(int32_t)) == 0 &&
           memcmp(x->tgt_len, y->tgt_len, (size_t)x->B * sizeof(int32_t)) == 0;
}

static void check_resume(const Fixture *fx, int max_len) {
    const int dp = 2, rank = 1, budget = 160;
    const uint64_t seed = 1234;
    Dataset a, b;
    char err[256];
    CHECK(dataset_init(&a, &fx->tf, DIR_EN_JA, max_len, budget, rank, dp, seed, PAD, BOS, EOS, err, sizeof err) == 0,
          "%s", err);
    const int nb = a.n_batches;
    CHECK(nb > 20, "resume test needs > 20 batches, has %d", nb);
    /* Run into epoch 1, then save 10 batches before its end. */
    for (int k = 0; k < nb + nb - 10; k++) {
        OwnedBatch ob;
        dataset_next(&a, &ob, NULL);
        owned_batch_free(&ob);
    }
    DataCursor saved = dataset_cursor(&a);
    CHECK(saved.epoch == 1 && saved.position == nb - 10 && saved.seed == seed, "saved cursor %lld/%lld",
          (long long)saved.epoch, (long long)saved.position);

    CHECK(dataset_init(&b, &fx->tf, DIR_EN_JA, max_len, budget, rank, dp, seed, PAD, BOS, EOS, err, sizeof err) == 0,
          "%s", err);
    err[0] = 0;
    DataCursor other = saved;
    other.seed = seed + 1;
    CHECK(dataset_seek(&b, other, err, sizeof err) == -1 && err[0] != 0, "seek with another seed accepted");
    CHECK(dataset_cursor(&b).epoch == 0 && dataset_cursor(&b).position == 0, "refused seek moved the cursor");
    DataCursor beyond = saved;
    beyond.position = nb + 1;
    err[0] = 0;
    CHECK(dataset_seek(&b, beyond, err, sizeof err) == -1 && err[0] != 0, "seek beyond the epoch accepted");
    DataCursor negative = saved;
    negative.epoch = -1;
    CHECK(dataset_seek(&b, negative, err, sizeof err) == -1, "seek to epoch -1 accepted");
    CHECK(dataset_seek(&b, saved, err, sizeof err) == 0, "seek refused: %s", err);

    int differ = 0;
    long ga = 0, gb = 0;
    for (int k = 0; k < 25; k++) {  // crosses into epoch 2 after 10
        OwnedBatch x, y;
        dataset_next(&a, &x, &ga);
        dataset_next(&b, &y, &gb);
        if (!same_batch(&x.view, &y.view) || ga != gb) differ++;
        DataCursor ca = dataset_cursor(&a), cb = dataset_cursor(&b);
        if (ca.epoch != cb.epoch || ca.position != cb.position) differ++;
        owned_batch_free(&x);
        owned_batch_free(&y);
    }
    CHECK(differ == 0, "%d batches differ after resuming", differ);
    CHECK(dataset_cursor(&a).epoch == 2 && dataset_cursor(&a).position == 15, "did not cross into epoch 2");

    /* The end-of-epoch position is the start of the next epoch. */
    DataCursor end = {.seed = seed, .epoch = 0, .position = nb};
    CHECK(dataset_seek(&b, end, err, sizeof err) == 0, "seek to end of epoch refused: %s", err);
    CHECK(dataset_cursor(&b).epoch == 1 && dataset_cursor(&b).position == 0, "end of epoch not normalised");
    dataset_free(&a);
    dataset_free(&b);
}

static void check_direction(const Fixture *fx, int max_len) {
    Dataset d;
    char err[256];
    CHECK(dataset_init(&d, &fx->tf, DIR_JA_EN, max_len, 128, 0, 1, 3, PAD, BOS, EOS, err, sizeof err) == 0, "%s",
          err);
    OwnedBatch ob;
    dataset_next(&d, &ob, NULL);
    int p = ob.view.src[0] - JA_BASE;
    CHECK(p >= 0 && p < fx->n, "ja-en source row starts with %d", ob.view.src[0]);
    if (p >= 0 && p < fx->n) {
        CHECK(ob.view.src_len[0] == fx->len[1][p] + 1, "ja-en source is not the Japanese side");
        CHECK(ob.view.tgt_out[0] == EN_BASE + p, "ja-en target is not the English side");
    }
    owned_batch_free(&ob);
    dataset_free(&d);
    Direction dir;
    CHECK(direction_parse("en-ja", &dir) == 0 && dir == DIR_EN_JA, "en-ja");
    CHECK(direction_parse("ja-en", &dir) == 0 && dir == DIR_JA_EN, "ja-en");
    CHECK(direction_parse("en-fr", &dir) == -1, "en-fr accepted");
    CHECK(direction_parse("", &dir) == -1, "empty direction accepted");
}

static void check_eval(const Fixture *fx, int max_len, int budget, int dp, int rank) {
    Dataset d;
    char err[256];
    CHECK(dataset_init(&d, &fx->tf, DIR_EN_JA, max_len, budget, rank, dp, 5, PAD, BOS, EOS, err, sizeof err) == 0,
          "%s", err);
    int nb = dataset_eval_batches(&d);
    CHECK(nb == dataset_eval_batches(&d), "eval batch count changes");
    int *seen = calloc((size_t)fx->n, sizeof(int));
    int32_t *pairs = malloc((size_t)fx->n * sizeof(int32_t)), *index = malloc((size_t)fx->n * sizeof(int32_t));
    int mismatched = 0, over = 0, unsorted = 0, prev_max = 0;
    for (int i = 0; i < nb; i++) {
        OwnedBatch ob;
        dataset_eval_batch(&d, i, &ob, index);
        verify_batch(fx, DIR_EN_JA, max_len, &ob.view, pairs);
        for (int r = 0; r < ob.view.B; r++) {
            if (pairs[r] != index[r]) mismatched++;
            if (index[r] >= 0 && index[r] < fx->n) seen[index[r]]++;
        }
        int m = ob.view.S > ob.view.T ? ob.view.S : ob.view.T;
        if (m < prev_max) unsorted++;
        prev_max = m;
        if (padded(&ob.view) > budget) over++;
        owned_batch_free(&ob);
    }
    CHECK(mismatched == 0, "%d eval rows with a wrong index", mismatched);
    CHECK(over == 0, "%d eval batches over budget %d", over, budget);
    CHECK(unsorted == 0, "%d eval batches out of length order", unsorted);
    int wrong = 0;
    for (int i = 0; i < fx->n; i++) wrong += seen[i] != (usable(fx, i, max_len) ? 1 : 0);
    CHECK(wrong == 0, "eval (budget %d, dp %d): %d pairs not covered exactly once", budget, dp, wrong);
    free(seen);
    free(pairs);
    free(index);
    dataset_free(&d);
}

static void check_init_errors(const Fixture *fx, int max_len) {
    Dataset d;
    char err[256];
    err[0] = 0;
    CHECK(dataset_init(&d, &fx->tf, DIR_EN_JA, max_len, max_len - 1, 0, 1, 1, PAD, BOS, EOS, err, sizeof err) == -1 &&
              strstr(err, "batch_tokens") != NULL,
          "budget below the longest pair accepted (%s)", err);
    CHECK(dataset_init(&d, &fx->tf, DIR_EN_JA, max_len, max_len, 0, 1, 1, PAD, BOS, EOS, err, sizeof err) == 0,
          "budget equal to the longest pair refused: %s", err);
    dataset_free(&d);
    err[0] = 0;
    CHECK(dataset_init(&d, &fx->tf, DIR_EN_JA, max_len, 100, 4, 4, 1, PAD, BOS, EOS, err, sizeof err) == -1 &&
              err[0] != 0,
          "dp_rank 4 of 4 accepted");
    CHECK(dataset_init(&d, &fx->tf, DIR_EN_JA, max_len, 100, -1, 2, 1, PAD, BOS, EOS, err, sizeof err) == -1,
          "dp_rank -1 accepted");
    CHECK(dataset_init(&d, &fx->tf, DIR_EN_JA, 1, 100, 0, 1, 1, PAD, BOS, EOS, err, sizeof err) == -1,
          "max_len 1 accepted");
    CHECK(dataset_init(&d, &fx->tf, DIR_EN_JA, max_len, 0, 0, 1, 1, PAD, BOS, EOS, err, sizeof err) == -1,
          "batch_tokens 0 accepted");
    dataset_free(&d);  // safe on a refused init

    /* Two usable pairs (one too long, one empty) cannot feed three ranks. */
    int en[4] = {3, 40, 0, 5}, ja[4] = {4, 2, 3, 5};
    Fixture tiny;
    fixture_build(&tiny, 4, en, ja);
    err[0] = 0;
    CHECK(dataset_init(&d, &tiny.tf, DIR_EN_JA, 32, 64, 0, 3, 1, PAD, BOS, EOS, err, sizeof err) == -1 && err[0] != 0,
          "3 ranks accepted for 2 usable pairs");
    CHECK(dataset_init(&d, &tiny.tf, DIR_EN_JA, 32, 64, 1, 2, 1, PAD, BOS, EOS, err, sizeof err) == 0, "%s", err);
    CHECK(d.n_usable == 2 && d.n_too_long == 1 && d.n_batches == 1, "tiny: usable %d too long %ld batches %d",
          d.n_usable, d.n_too_long, d.n_batches);
    dataset_free(&d);
    int en0[2] = {40, 0}, ja0[2] = {1, 1};
    Fixture none;
    fixture_build(&none, 2, en0, ja0);
    err[0] = 0;
    CHECK(dataset_init(&d, &none.tf, DIR_EN_JA, 32, 64, 0, 1, 1, PAD, BOS, EOS, err, sizeof err) == -1 && err[0] != 0,
          "no usable pair accepted");
    /* Offsets past the token array are refused. */
    tiny.off[1][4] = tiny.tf.n_tokens + 1;
    CHECK(dataset_init(&d, &tiny.tf, DIR_EN_JA, 32, 64, 0, 1, 1, PAD, BOS, EOS, err, sizeof err) == -1,
          "offsets beyond n_tokens accepted");
    fixture_free(&tiny);
    fixture_free(&none);
}

/* Small fixtures for the cut: a greedy cut would strand a pair (dp 2), and a
 * set where no legal cut exists, so the tail is merged. */
static void check_cut_corners(void) {
    /* Padded lengths 10 x4 and 20 x3, budget 32, dp 2: greedy gives
     * [10 10 10 10][20 20][20] and must merge; [10 10 10][10 20][20 20] fits. */
    int en[7] = {9, 9, 9, 9, 19, 19, 19}, ja[7] = {5, 5, 5, 5, 5, 5, 5};
    Fixture fx;
    fixture_build(&fx, 7, en, ja);
    for (uint64_t seed = 0; seed < 20; seed++) check_epoch(&fx, DIR_EN_JA, 32, 2, 32, seed);
    fixture_free(&fx);

    /* Padded 20 x3 and 10 x2, budget 32, dp 2: no legal cut; still every pair
     * exactly once and every rank gets a row each step. */
    int en2[5] = {19, 19, 19, 9, 9}, ja2[5] = {5, 5, 5, 5, 5};
    fixture_build(&fx, 5, en2, ja2);
    Dataset d[2];
    char err[256];
    for (int r = 0; r < 2; r++)
        CHECK(dataset_init(&d[r], &fx.tf, DIR_EN_JA, 32, 32, r, 2, 9, PAD, BOS, EOS, err, sizeof err) == 0, "%s", err);
    int seen[5] = {0}, empty = 0;
    for (int step = 0; step < d[0].n_batches; step++) {
        for (int r = 0; r < 2; r++) {
            OwnedBatch ob;
            int32_t pairs[8];
            dataset_next(&d[r], &ob, NULL);
            verify_batch(&fx, DIR_EN_JA, 32, &ob.view, pairs);
            if (ob.view.B < 1) empty++;
            for (int i = 0; i < ob.view.B && i < 8; i++)
                if (pairs[i] >= 0) seen[pairs[i]]++;
            owned_batch_free(&ob);
        }
    }
    CHECK(d[0].n_batches == 2 && empty == 0, "infeasible cut: %d batches, %d empty shares", d[0].n_batches, empty);
    for (int i = 0; i < 5; i++) CHECK(seen[i] == 1, "infeasible cut: pair %d seen %d times", i, seen[i]);
    for (int r = 0; r < 2; r++) dataset_free(&d[r]);
    fixture_free(&fx);
}

static double now_ms(void) { return 1e3 * tp_now_s(); }

/* 50k pairs: plan building stays in milliseconds, coverage still exact. */
static void check_scale(void) {
    const int n = 50000, max_len = 64;
    int *en = malloc(n * sizeof(int)), *ja = malloc(n * sizeof(int));
    for (int i = 0; i < n; i++) {
        en[i] = 1 + (int)rnd(70);
        ja[i] = 1 + (int)rnd(70);
    }
    Fixture fx;
    fixture_build(&fx, n, en, ja);
    Dataset d;
    char err[256];
    double t0 = now_ms();
    int rc = dataset_init(&d, &fx.tf, DIR_EN_JA, max_len, 4096, 0, 1, 11, PAD, BOS, EOS, err, sizeof err);
    double t1 = now_ms();
    CHECK(rc == 0, "%s", err);
    DataCursor c = {.seed = 11, .epoch = 5, .position = 0};
    double t2 = now_ms();
    CHECK(dataset_seek(&d, c, err, sizeof err) == 0, "%s", err);
    double t3 = now_ms();
    printf("50k pairs: init %.2f ms, epoch plan %.2f ms, %d batches\n", t1 - t0, t3 - t2, d.n_batches);
    /* Generous bound (sanitizer builds are slow); a quadratic plan takes seconds. */
    CHECK(t3 - t2 < 500.0, "plan over 50k pairs took %.1f ms", t3 - t2);
    int32_t *seen = calloc((size_t)n, sizeof(int32_t));
    int wrong = 0;
    for (int g = 0; g < d.n_batches; g++)
        for (int j = d.batch_start[g]; j < d.batch_start[g + 1]; j++) seen[d.order[j]]++;
    for (int i = 0; i < n; i++) wrong += seen[i] != (usable(&fx, i, max_len) ? 1 : 0);
    CHECK(wrong == 0, "50k plan: %d pairs not planned exactly once", wrong);
    free(seen);
    dataset_free(&d);
    fixture_free(&fx);
    free(en);
    free(ja);
}

/* Several corpora: two views of one fixture (pairs [0, cut) and [cut, n)),
 * each row checked token by token. Taken once each, the mix is the one
 * file's dataset batch for batch; with copies {1, 3}, one epoch over dp
 * ranks holds every usable pair of the first corpus once and of the second
 * three times, no other pair, and as many steps on every rank. */
static void check_mix(const Fixture *fx, int max_len) {
    const int cut = fx->n / 3, dp = 2, budget = 300;
    TokenFile a = fx->tf, b = fx->tf;
    a.n_pairs = cut;
    b.n_pairs = fx->n - cut;
    b.en_off = fx->tf.en_off + cut;
    b.ja_off = fx->tf.ja_off + cut;
    const TokenFile *tfs[2] = {&a, &b};
    char err[256];
    Dataset one, mix;
    CHECK(dataset_init(&one, &fx->tf, DIR_EN_JA, max_len, budget, 0, 1, 11, PAD, BOS, EOS, err, sizeof err) == 0 &&
              dataset_init_mix(&mix, tfs, NULL, 2, DIR_EN_JA, max_len, budget, 0, 1, 11, PAD, BOS, EOS, err,
                               sizeof err) == 0,
          "%s", err);
    int differ = 0;
    for (int g = 0; g < 2 * one.n_batches; g++) {
        OwnedBatch x, y;
        dataset_next(&one, &x, NULL);
        dataset_next(&mix, &y, NULL);
        differ += x.view.B != y.view.B || x.view.S != y.view.S ||
                  memcmp(x.src, y.src, (size_t)x.view.B * x.view.S * sizeof(int32_t)) != 0;
        owned_batch_free(&x);
        owned_batch_free(&y);
    }
    CHECK(one.n_batches == mix.n_batches && differ == 0, "a mix of two views taken once: %d of %d batches differ",
          differ, 2 * one.n_batches);
    dataset_free(&one);
    dataset_free(&mix);

    const int copies[2] = {1, 3};
    int *seen = calloc((size_t)fx->n, sizeof *seen);
    int32_t *pairs = malloc((size_t)fx->n * sizeof *pairs);
    int steps[2] = {0, 0}, bad = 0;
    for (int r = 0; r < dp; r++) {
        Dataset d;
        CHECK(dataset_init_mix(&d, tfs, copies, 2, DIR_EN_JA, max_len, budget, r, dp, 12, PAD, BOS, EOS, err,
                               sizeof err) == 0, "%s", err);
        steps[r] = d.n_batches;
        for (int g = 0; g < d.n_batches; g++) {
            OwnedBatch ob;
            dataset_next(&d, &ob, NULL);
            bad += verify_batch(fx, DIR_EN_JA, max_len, &ob.view, pairs);
            for (int i = 0; i < ob.view.B; i++)
                if (pairs[i] >= 0) seen[pairs[i]]++;
            owned_batch_free(&ob);
        }
        CHECK(d.cursor.epoch == 1 && d.cursor.position == 0, "rank %d did not end the epoch", r);
        dataset_free(&d);
    }
    int wrong = 0;
    for (int i = 0; i < fx->n; i++) wrong += seen[i] != (usable(fx, i, max_len) ? (i < cut ? 1 : 3) : 0);
    CHECK(bad == 0 && wrong == 0 && steps[0] == steps[1],
          "copies {1, 3}: %d bad batches, %d pairs taken a wrong number of times, steps %d and %d", bad, wrong,
          steps[0], steps[1]);
    const int bad_copies[2] = {1, 0};
    Dataset d;
    CHECK(dataset_init_mix(&d, tfs, bad_copies, 2, DIR_EN_JA, max_len, budget, 0, 1, 1, PAD, BOS, EOS, err,
                           sizeof err) != 0 && strstr(err, "corpus 2 is taken 0 times"), "copies 0 accepted: %s", err);
    free(seen);
    free(pairs);
}

int main(void) {
    /* ~1000 pairs, lengths 1..31 with a few up to 40 (over max_len 32), one
     * side empty twice, and one pair at the longest usable length. */
    const int n = 1000, max_len = 32;
    int en[1000], ja[1000];
    for (int i = 0; i < n; i++) {
        en[i] = rnd(100) < 4 ? 32 + (int)rnd(9) : 1 + (int)rnd(31);
        ja[i] = rnd(100) < 4 ? 32 + (int)rnd(9) : 1 + (int)rnd(31);
    }
    en[0] = 31;
    ja[0] = 12;
    en[5] = 0;
    ja[17] = 0;
    Fixture fx;
    fixture_build(&fx, n, en, ja);
    long too_long = count_too_long(&fx, max_len);
    CHECK(too_long > 20 && too_long < 150, "fixture has %ld too-long pairs", too_long);

    const int budgets[] = {32, 45, 100, 400, 1500};
    for (int dp = 1; dp <= 4; dp++)
        for (size_t k = 0; k < sizeof budgets / sizeof budgets[0]; k++)
            check_epoch(&fx, DIR_EN_JA, max_len, dp, budgets[k], 100 + (uint64_t)dp);
    check_epoch(&fx, DIR_JA_EN, max_len, 1, 300, 2);
    check_epoch(&fx, DIR_JA_EN, max_len, 3, 300, 2);
    check_epoch(&fx, DIR_EN_JA, 20, 2, 200, 4);  // a smaller max_len skips more

    check_buckets(&fx, max_len);
    check_mix(&fx, max_len);
    check_order(&fx, max_len);
    check_resume(&fx, max_len);
    check_direction(&fx, max_len);
    check_eval(&fx, max_len, 32, 1, 0);
    check_eval(&fx, max_len, 333, 3, 2);
    check_init_errors(&fx, max_len);
    check_cut_corners();
    check_scale();
    fixture_free(&fx);
    return check_report("test_dataset");
}
