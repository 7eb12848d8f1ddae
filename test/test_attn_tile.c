/* test_attn_tile.c: the fused attention kernels' register tiling
 * (kernels/cuda/attn_tile.h) proven on the CPU, where no GPU runs it. Every
 * product of the forward (S = q k^T, out = P v) and the backward (dv += P^T
 * dout, dP = dout v^T, dq += dS k, dk += dS^T q), built by the very
 * functions the kernels call, for many (Tq, Tk, D) shapes, ragged ones
 * included:
 *  1. the mapping: over all 256 threads and their tile steps, every output
 *     element is written exactly once, and every operand read (clamped
 *     rows and columns, k = 0 and K - 1) names an in-range element inside
 *     the shared memory att_*_smem_floats sizes;
 *  2. banks: for one tile step and one tile row (column), the reads of a
 *     warp's threads fall in distinct banks or share an address;
 *  3. the loops themselves: att_run for thread 0, 1, ..., 255 in turn (each
 *     element has one writer, so the order is immaterial), through the
 *     kernels' phases and buffer reuse, against the plain per-element loop
 *     (acc = 0; acc = fmaf(a_k, b_k, acc) for k from 0; store or x + acc),
 *     bit for bit, with untouched memory checked untouched; the backward's
 *     gradients also written over NaN (GRAD_WRITE) against the loop adding
 *     into zeros. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "testrng.h"
#include "attn_tile.h"

#define SENTINEL 12345.0f  // memory a product must leave alone
#define N_BANKS 32
#define WIDE_OUTPUT 128    // outputs at most this wide read conflict-free

/* ---- 1 and 2: the mapping, the reads' range, the banks --------------------------- */

/* Offset of p in the shared memory [base, base + n), or -1 outside. */
static long smem_offset(const float *p, const float *base, size_t n) {
    if (p < base || p >= base + n) return -1;
    return (long)(p - base);
}

/* Most distinct addresses of one bank among a warp's reads (addr[t] < 0: the
 * thread reads nothing this step): the conflict's ways, 1 when free. */
static int bank_ways(const long *addr, int n) {
    long a[ATT_WARP];
    int m = 0;
    for (int t = 0; t < n; t++) {  // the distinct addresses, sorted
        if (addr[t] < 0) continue;
        int at = m;
        while (at > 0 && a[at - 1] > addr[t]) at--;
        if (at > 0 && a[at - 1] == addr[t]) continue;
        memmove(a + at + 1, a + at, (size_t)(m - at) * sizeof(long));
        a[at] = addr[t];
        m++;
    }
    int per_bank[N_BANKS] = {0}, worst = 0;
    for (int t = 0; t < m; t++)
        if (++per_bank[a[t] % N_BANKS] > worst) worst = per_bank[a[t] % N_BANKS];
    return worst;
}

/* The reads of tile element row r (is_a) or column r of thread tid's tile
 * e: -1 when out of range (counted in *bad), else the shared-memory offset. */
static long read_offset(const AttProduct *p, AttTiles g, int e, int r, int is_a, const float *smem, size_t n,
                        long *bad) {
    const AttMat X = is_a ? p->A : p->B;
    const int lim = is_a ? p->M : p->N;
    const int idx = is_a ? att_clamp(att_row(g, e, r), lim) : att_clamp(att_col(g, e, r), lim);
    if (idx < 0 || idx >= lim) {
        (*bad)++;
        return -1;
    }
    const long off = is_a ? (long)idx * X.rs : (long)idx * X.cs;
    const long k_step = is_a ? X.cs : X.rs;
    if (p->K > 0 && smem_offset(X.p + off + (long)(p->K - 1) * k_step, smem, n) < 0) (*bad)++;
    const long o = smem_offset(X.p + off, smem, n);
    if (o < 0) (*bad)++;
    return o;
}

/* Worst bank ways of the operand reads over every warp and tile step. */
static int worst_ways(const AttProduct *p, AttTiles g, const float *smem, size_t n, long *bad) {
    int worst = 0;
    for (int w = 0; w < ATT_THREADS / ATT_WARP; w++) {
        for (int step = 0; step * ATT_THREADS < att_tile_count(g); step++) {
            for (int is_a = 0; is_a < 2; is_a++) {
                for (int r = 0; r < (is_a ? ATT_TM : ATT_TN); r++) {
                    long addr[ATT_WARP];
                    for (int t = 0; t < ATT_WARP; t++) {
                        const int e = att_first_tile(p, w * ATT_WARP + t) + step * ATT_THREADS;
                        addr[t] = e < att_tile_count(g) ? read_offset(p, g, e, r, is_a, smem, n, bad) : -1;
                    }
                    const int ways = bank_ways(addr, ATT_WARP);
                    if (ways > worst) worst = ways;
                }
            }
        }
    }
    return worst;
}

/* Checks 1 and 2 for product p; c_smem: whether C lies in the shared memory. */
static void check_mapping(const char *what, const AttProduct *p, const float *smem, size_t n, int c_smem) {
    const AttTiles g = att_tiles(p->M, p->N);
    unsigned char *count = calloc((size_t)p->M * p->N, 1);
    long bad_read = 0, bad_write = 0, n_writes = 0;
    for (int tid = 0; tid < ATT_THREADS; tid++) {
        for (int e = att_first_tile(p, tid); e < att_tile_count(g); e += ATT_THREADS) {
            for (int r = 0; r < ATT_TM; r++) read_offset(p, g, e, r, 1, smem, n, &bad_read);
            for (int c = 0; c < ATT_TN; c++) read_offset(p, g, e, c, 0, smem, n, &bad_read);
            for (int r = 0; r < ATT_TM; r++) {
                for (int c = 0; c < ATT_TN; c++) {
                    const int m = att_row(g, e, r), col = att_col(g, e, c);
                    if (m >= p->M || col >= p->N) continue;
                    if (m < 0 || col < 0) {
                        bad_write++;
                        continue;
                    }
                    count[(size_t)m * p->N + col]++;
                    n_writes++;
                    if (c_smem && smem_offset(p->C + m * p->c_rs + col, smem, n) < 0) bad_write++;
                }
            }
        }
    }
    long wrong = 0;
    for (size_t i = 0; i < (size_t)p->M * p->N; i++) wrong += count[i] != 1;
    free(count);
    CHECK(wrong == 0 && bad_write == 0, "%s: %ld of %d x %d elements not written exactly once, %ld writes outside",
          what, wrong, p->M, p->N, bad_write);
    CHECK(n_writes == (long)p->M * p->N, "%s: %ld writes for %d x %d", what, n_writes, p->M, p->N);
    CHECK(bad_read == 0, "%s: %ld reads out of range (M %d N %d K %d)", what, bad_read, p->M, p->N, p->K);
    const int ways = worst_ways(p, g, smem, n, &bad_read);
    const int allowed = p->N <= WIDE_OUTPUT ? 1 : 2;
    CHECK(ways <= allowed, "%s: %d-way bank conflict (M %d N %d K %d)", what, ways, p->M, p->N, p->K);
}

/* Every product of both kernels at one shape (outputs in a fake global
 * buffer, never dereferenced). */
static void check_shape_mapping(int Tq, int Tk, int D) {
    char what[160];
    static float global_rows[1];
    const long long HD = 3LL * D;
    const size_t nf = att_fwd_smem_floats(Tk, D);
    float *fsm = malloc(nf * sizeof(float));
    const AttFwdSmem fs = att_fwd_smem(fsm, Tk, D);
    CHECK(fs.S + (size_t)ATT_QROWS * fs.ld_s == fsm + nf, "fwd layout ends at its size (Tk %d D %d)", Tk, D);
    for (int i0 = 0; i0 < Tq; i0 += ATT_QROWS) {
        const int nq = Tq - i0 < ATT_QROWS ? Tq - i0 : ATT_QROWS;
        const AttProduct s = att_fwd_scores(&fs, nq, Tk, D), o = att_fwd_out(&fs, global_rows, HD, nq, Tk, D);
        snprintf(what, sizeof what, "fwd S = q k^T Tq %d (rows %d+%d) Tk %d D %d", Tq, i0, nq, Tk, D);
        check_mapping(what, &s, fsm, nf, 1);
        snprintf(what, sizeof what, "fwd out = P v Tq %d (rows %d+%d) Tk %d D %d", Tq, i0, nq, Tk, D);
        check_mapping(what, &o, fsm, nf, 0);
    }
    free(fsm);
    const size_t nb = att_bwd_smem_floats(Tq, Tk, D);
    float *bsm = malloc(nb * sizeof(float));
    const AttBwdSmem bs = att_bwd_smem(bsm, Tq, Tk, D);
    CHECK(bs.Y + (size_t)Tq * bs.ld_s == bsm + nb, "bwd layout ends at its size (Tq %d Tk %d D %d)", Tq, Tk, D);
    const AttProduct prods[4] = {att_bwd_dv(&bs, global_rows, HD, 1, Tq, Tk, D), att_bwd_dp(&bs, Tq, Tk, D),
                                 att_bwd_dq(&bs, global_rows, HD, 1, Tq, Tk, D),
                                 att_bwd_dk(&bs, global_rows, HD, 1, Tq, Tk, D)};
    const char *names[4] = {"dv += P^T dout", "dP = dout v^T", "dq += dS k", "dk += dS^T q"};
    for (int i = 0; i < 4; i++) {
        snprintf(what, sizeof what, "bwd %s Tq %d Tk %d D %d", names[i], Tq, Tk, D);
        check_mapping(what, &prods[i], bsm, nb, i == 1);
    }
    CHECK(prods[3].first % ATT_WARP == 0, "dk's first thread %d starts a warp", prods[3].first);
    free(bsm);
}

/* ---- 3: the loops on the host, bit for bit ------------------------------------- */

static void run_all(const AttProduct *p) {
    for (int tid = 0; tid < ATT_THREADS; tid++) att_run(p, tid);
}

static uint32_t bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* Rows [0, n) of head h of (T, H*D) rows x into dst (row stride ld), as
 * the kernels' fused_load_rows does. */
static void load_rows(float *dst, int ld, const float *x, long long HD, int n, int D) {
    for (int r = 0; r < n; r++)
        for (int d = 0; d < D; d++) dst[r * ld + d] = x[r * HD + d];
}

/* got (row stride ld) against want (row stride D), n x D, bit for bit. */
static void check_rows(const char *what, const float *got, long long ld, const float *want, int n, int D) {
    long diff = 0;
    for (int i = 0; i < n; i++)
        for (int d = 0; d < D; d++) diff += bits(got[i * ld + d]) != bits(want[(size_t)i * D + d]);
    CHECK(diff == 0, "%s: %ld of %d x %d elements differ from the plain loop", what, diff, n, D);
}

/* Elements of a (T, H*D) buffer outside head h still SENTINEL. */
static void check_other_heads(const char *what, const float *x, int T, int H, int D, int h) {
    long touched = 0;
    for (int t = 0; t < T; t++)
        for (int c = 0; c < H * D; c++)
            if (c / D != h) touched += bits(x[(size_t)t * H * D + c]) != bits(SENTINEL);
    CHECK(touched == 0, "%s: %ld elements of other heads written", what, touched);
}

/* A (T, H*D) buffer: head h random, the rest SENTINEL. */
static float *head_rows(Rng *rng, int T, int H, int D, int h) {
    float *x = malloc((size_t)T * H * D * sizeof(float));
    for (size_t i = 0; i < (size_t)T * H * D; i++)
        x[i] = (int)(i % ((size_t)H * D)) / D == h ? rng_uniform(rng, -1.0f, 1.0f) : SENTINEL;
    return x;
}

/* The plain loop: C[i][j] (C = acc or C = C + acc), acc over k of
 * fmaf(a(i, k), b(k, j)) with a at A[i * a_rs + k * a_cs], b likewise. */
static void plain(float *C, int ldc, int accumulate, const float *A, long a_rs, long a_cs, const float *B, long b_rs,
                  long b_cs, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc = fmaf(A[i * a_rs + k * a_cs], B[k * b_rs + j * b_cs], acc);
            C[(size_t)i * ldc + j] = accumulate ? C[(size_t)i * ldc + j] + acc : acc;
        }
}

/* Every float of n set to NaN: shared memory never written reads NaN. */
static float *nan_floats(size_t n) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

/* Head h of (T, H*D) rows as a dense (T, D) copy. */
static float *dense(const float *x, int T, int H, int D, int h) {
    float *y = malloc((size_t)T * D * sizeof(float));
    for (int t = 0; t < T; t++) memcpy(y + (size_t)t * D, x + (size_t)t * H * D + (size_t)h * D, D * sizeof(float));
    return y;
}

/* The forward's phases, query tile by query tile, with an arbitrary
 * stand-in for the softmax (the products are what is under test). */
static void emulate_fwd(Rng *rng, int Tq, int Tk, int D) {
    const int H = 3, h = 1;
    const long long HD = (long long)H * D;
    float *q = head_rows(rng, Tq, H, D, h), *k = head_rows(rng, Tk, H, D, h), *v = head_rows(rng, Tk, H, D, h);
    float *out = head_rows(rng, Tq, H, D, h);  // overwritten: head h must end as the plain result
    float *qd = dense(q, Tq, H, D, h), *kd = dense(k, Tk, H, D, h), *vd = dense(v, Tk, H, D, h);
    const size_t nf = att_fwd_smem_floats(Tk, D);
    float *smem = nan_floats(nf), *S = malloc((size_t)ATT_QROWS * Tk * sizeof(float));
    float *O = malloc((size_t)ATT_QROWS * D * sizeof(float));
    const AttFwdSmem s = att_fwd_smem(smem, Tk, D);
    load_rows(s.K, s.ld_d, k + h * D, HD, Tk, D);
    load_rows(s.V, D, v + h * D, HD, Tk, D);
    char what[120];
    for (int i0 = 0; i0 < Tq; i0 += ATT_QROWS) {
        const int nq = Tq - i0 < ATT_QROWS ? Tq - i0 : ATT_QROWS;
        load_rows(s.Q, s.ld_d, q + (size_t)i0 * HD + h * D, HD, nq, D);
        const AttProduct ps = att_fwd_scores(&s, nq, Tk, D);
        run_all(&ps);
        plain(S, Tk, 0, qd + (size_t)i0 * D, D, 1, kd, 1, D, nq, Tk, D);
        snprintf(what, sizeof what, "fwd S Tq %d (rows %d+%d) Tk %d D %d", Tq, i0, nq, Tk, D);
        check_rows(what, s.S, s.ld_s, S, nq, Tk);
        for (int i = 0; i < nq; i++)  // the softmax's stand-in, in place
            for (int j = 0; j < Tk; j++) s.S[i * s.ld_s + j] = S[(size_t)i * Tk + j] = 0.25f * S[(size_t)i * Tk + j] - 0.5f;
        const AttProduct po = att_fwd_out(&s, out + (size_t)i0 * HD + h * D, HD, nq, Tk, D);
        run_all(&po);
        plain(O, D, 0, S, Tk, 1, vd, D, 1, nq, D, Tk);
        snprintf(what, sizeof what, "fwd out Tq %d (rows %d+%d) Tk %d D %d", Tq, i0, nq, Tk, D);
        check_rows(what, out + (size_t)i0 * HD + h * D, HD, O, nq, D);
        /* the same product stored as bf16 bits (C16): each element the rounding of the fp32 one */
        uint16_t *o16 = malloc((size_t)nq * HD * sizeof(uint16_t));
        for (size_t i = 0; i < (size_t)nq * HD; i++) o16[i] = 0xffffu;
        AttProduct p16 = att_fwd_out(&s, NULL, HD, nq, Tk, D);
        p16.C16 = o16 + h * D;
        run_all(&p16);
        long diff = 0, stray = 0;
        for (int i = 0; i < nq; i++)
            for (int d = 0; d < (int)HD; d++) {
                const uint16_t g = o16[(size_t)i * HD + d];
                if (d / D == h) diff += g != tp_f32_to_bf16(O[(size_t)i * D + d - h * D]);
                else stray += g != 0xffffu;
            }
        CHECK(diff == 0 && stray == 0, "%s stored as bf16: %ld elements not the fp32 ones rounded, %ld written "
              "outside head %d", what, diff, stray, h);
        free(o16);
    }
    snprintf(what, sizeof what, "fwd out Tq %d Tk %d D %d", Tq, Tk, D);
    check_other_heads(what, out, Tq, H, D, h);
    free(q), free(k), free(v), free(out), free(qd), free(kd), free(vd), free(smem), free(S), free(O);
}

typedef struct {
    float *q, *k, *v, *dout, *dq, *dk, *dv, *P;  // (T, H*D) rows, P (Tq, Tk)
} BwdData;

/* The backward's phases in the kernel's order and buffer reuse; accumulate
 * as the kernel's flag (0: GRAD_WRITE), the plain loop always adding (into
 * the zeros want holds then). */
static void emulate_bwd_phases(const BwdData *x, const BwdData *want, int accumulate, int Tq, int Tk, int D, int H,
                               int h) {
    const long long HD = (long long)H * D;
    const size_t nb = att_bwd_smem_floats(Tq, Tk, D), hd = (size_t)h * D;
    float *smem = nan_floats(nb), *dS = calloc((size_t)Tq * Tk, sizeof(float));
    const AttBwdSmem s = att_bwd_smem(smem, Tq, Tk, D);
    load_rows(s.X, s.ld_d, x->dout + hd, HD, Tq, D);
    load_rows(s.W, s.ld_d, x->v + hd, HD, Tk, D);
    for (int e = 0; e < Tq * Tk; e++) s.Y[(e / Tk) * s.ld_s + e % Tk] = x->P[e];
    const AttProduct pdv = att_bwd_dv(&s, x->dv + hd, HD, accumulate, Tq, Tk, D);
    run_all(&pdv);
    const AttProduct pdp = att_bwd_dp(&s, Tq, Tk, D);
    run_all(&pdp);
    plain(dS, Tk, 0, want->dout, D, 1, want->v, 1, D, Tq, Tk, D);  // dP
    char what[120];
    snprintf(what, sizeof what, "bwd dP Tq %d Tk %d D %d", Tq, Tk, D);
    check_rows(what, s.Y, s.ld_s, dS, Tq, Tk);
    for (int i = 0; i < Tq; i++)  // the softmax backward's stand-in, in place
        for (int j = 0; j < Tk; j++) {
            float *y = s.Y + i * s.ld_s + j, *r = dS + (size_t)i * Tk + j;
            *y = *r = (*r - 0.5f) * x->P[(size_t)i * Tk + j];
        }
    load_rows(s.X, s.ld_d, x->q + hd, HD, Tq, D);
    load_rows(s.W, s.ld_d, x->k + hd, HD, Tk, D);
    const AttProduct pdq = att_bwd_dq(&s, x->dq + hd, HD, accumulate, Tq, Tk, D);
    const AttProduct pdk = att_bwd_dk(&s, x->dk + hd, HD, accumulate, Tq, Tk, D);
    run_all(&pdq);
    run_all(&pdk);
    plain(want->dv, D, 1, want->P, 1, Tk, want->dout, D, 1, Tk, D, Tq);  // P^T dout
    plain(want->dq, D, 1, dS, Tk, 1, want->k, D, 1, Tq, D, Tk);          // dS k
    plain(want->dk, D, 1, dS, 1, Tk, want->q, D, 1, Tk, D, Tq);          // dS^T q
    const float *got[3] = {x->dv, x->dq, x->dk}, *ref[3] = {want->dv, want->dq, want->dk};
    const char *names[3] = {"dv", "dq", "dk"};
    const int rows[3] = {Tk, Tq, Tk};
    for (int i = 0; i < 3; i++) {
        snprintf(what, sizeof what, "bwd %s%s Tq %d Tk %d D %d", names[i], accumulate ? "" : " written", Tq, Tk, D);
        check_rows(what, got[i] + hd, HD, ref[i], rows[i], D);
        check_other_heads(what, got[i], rows[i], H, D, h);
    }
    free(smem), free(dS);
}

/* Head h of (T, H*D) rows set to NaN: garbage a written gradient must not keep. */
static void nan_head(float *x, int T, int H, int D, int h) {
    for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++) x[(size_t)t * H * D + (size_t)h * D + d] = NAN;
}

/* write: the gradients start as NaN garbage in head h and are written
 * (accumulate 0), against the plain loop adding into zeros. */
static void emulate_bwd(Rng *rng, int Tq, int Tk, int D, bool write) {
    const int H = 3, h = 2;
    BwdData x, want;
    x.q = head_rows(rng, Tq, H, D, h), x.dout = head_rows(rng, Tq, H, D, h), x.dq = head_rows(rng, Tq, H, D, h);
    x.k = head_rows(rng, Tk, H, D, h), x.v = head_rows(rng, Tk, H, D, h);
    x.dk = head_rows(rng, Tk, H, D, h), x.dv = head_rows(rng, Tk, H, D, h);
    x.P = rand_floats((size_t)Tq * Tk, rng, 0.0f, 1.0f);
    want.q = dense(x.q, Tq, H, D, h), want.dout = dense(x.dout, Tq, H, D, h), want.dq = dense(x.dq, Tq, H, D, h);
    want.k = dense(x.k, Tk, H, D, h), want.v = dense(x.v, Tk, H, D, h);
    want.dk = dense(x.dk, Tk, H, D, h), want.dv = dense(x.dv, Tk, H, D, h);
    want.P = x.P;
    if (write) {
        nan_head(x.dq, Tq, H, D, h), nan_head(x.dk, Tk, H, D, h), nan_head(x.dv, Tk, H, D, h);
        memset(want.dq, 0, (size_t)Tq * D * sizeof(float));
        memset(want.dk, 0, (size_t)Tk * D * sizeof(float));
        memset(want.dv, 0, (size_t)Tk * D * sizeof(float));
    }
    emulate_bwd_phases(&x, &want, !write, Tq, Tk, D, H, h);
    float *all[] = {x.q, x.k, x.v, x.dout, x.dq, x.dk, x.dv, x.P,
                    want.q, want.k, want.v, want.dout, want.dq, want.dk, want.dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

int main(void) {
    /* Mapping: head sizes the model uses and odd ones, lengths around the
     * tile edges (4), the query tile (32), a warp of tiles, the 128-wide
     * outputs and past 256 tiles. */
    const int Ds[] = {1, 3, 4, 8, 16, 24, 32, 64, 128};
    const int Ts[] = {1, 2, 3, 4, 5, 7, 8, 31, 32, 33, 63, 64, 65, 100, 127, 129, 160, 257};
    const int nD = sizeof Ds / sizeof Ds[0], nT = sizeof Ts / sizeof Ts[0];
    for (int a = 0; a < nD; a++)
        for (int i = 0; i < nT; i++)
            for (int j = 0; j < nT; j++) check_shape_mapping(Ts[i], Ts[j], Ds[a]);
    /* The loops, bit for bit. */
    const int shapes[][3] = {{1, 1, 4},   {5, 7, 16},  {6, 9, 8},    {33, 70, 24}, {40, 40, 64},
                             {64, 64, 64}, {3, 130, 8}, {37, 1, 3},  {65, 33, 128}, {2, 300, 64}};
    Rng rng = {20261126};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        emulate_fwd(&rng, shapes[i][0], shapes[i][1], shapes[i][2]);
        emulate_bwd(&rng, shapes[i][0], shapes[i][1], shapes[i][2], false);
        emulate_bwd(&rng, shapes[i][0], shapes[i][1], shapes[i][2], true);
    }
    return check_report("test_attn_tile");
}
