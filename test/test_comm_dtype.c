/* test_comm_dtype.c: bf16 collectives over shared memory, 1 to 4 ranks.
 *
 * The contract (comm.h): a bf16 reduction widens every input to fp32, adds
 * in rank order in fp32 and rounds to bf16 once, ties to even. Each rank
 * computes that directly from the inputs of every rank and compares the
 * bits; for three or more ranks the test also checks that rounding after
 * every addition would have given other bits on some elements, so it could
 * tell the two apart. The conversions themselves are checked first against
 * hand-picked values (ties, overflow, NaN), since the expected results use
 * them too.
 */
#define _GNU_SOURCE
#include "check.h"
#include "comm_ranks.h"

#include "bf16.h"

#define BF16_CHUNK_ELEMS (2 * CHUNK_ELEMS)  // bf16 elements per collective chunk (SLOT_BYTES / 2)
#define BF16_DIRECT_ELEMS ((size_t)32768)  // DIRECT_MAX_BYTES / 2: above it the chunk is reduced by portions

static uint16_t vb(int rank, size_t i, int tag) { return tp_f32_to_bf16(val(rank, i, tag)); }

static uint16_t *alloc_bf16(size_t n_elems) { return malloc((n_elems ? n_elems : 1) * sizeof(uint16_t)); }

/* ---- the conversions ---- */

static uint16_t bits_of(float x) { return tp_f32_to_bf16(x); }

static float from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static void check_conversions(void) {
    // 1 + 2^-8 is half a bf16 ulp above 1: the tie goes to the even neighbour, 1.
    CHECK(bits_of(1.0f + 0x1p-8f) == 0x3f80, "tie to even (down): %04x", bits_of(1.0f + 0x1p-8f));
    CHECK(bits_of(1.0f + 3 * 0x1p-8f) == 0x3f82, "tie to even (up): %04x", bits_of(1.0f + 3 * 0x1p-8f));
    CHECK(bits_of(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81, "above the tie: %04x", bits_of(1.0f + 0x1p-8f + 0x1p-20f));
    CHECK(bits_of(1.0f + 0x1p-8f - 0x1p-20f) == 0x3f80, "below the tie: %04x", bits_of(1.0f + 0x1p-8f - 0x1p-20f));
    CHECK(bits_of(-1.0f - 3 * 0x1p-8f) == 0xbf82, "negative tie: %04x", bits_of(-1.0f - 3 * 0x1p-8f));
    CHECK(bits_of(from_bits(0x7f7fffffu)) == 0x7f80, "FLT_MAX rounds to infinity");
    CHECK(bits_of(INFINITY) == 0x7f80 && bits_of(-INFINITY) == 0xff80, "infinities kept");
    CHECK(bits_of(from_bits(0x7f800001u)) == 0x7fc0, "a NaN with a low payload stays NaN: %04x",
          bits_of(from_bits(0x7f800001u)));
    CHECK(isnan(tp_bf16_to_f32(bits_of(NAN))), "NaN round trip");
    CHECK(bits_of(from_bits(0x00000001u)) == 0x0000, "the smallest denormal rounds to zero");
    CHECK(tp_bf16_to_f32(0x3fc0) == 1.5f && tp_bf16_to_f32(0xc2f7) == -123.5f, "bf16 -> fp32 is exact");
    CHECK(tp_bf16_round(3.14159265f) == 3.140625f, "round: %.9g", tp_bf16_round(3.14159265f));
    CHECK(comm_dtype_bytes(COMM_F32) == 4 && comm_dtype_bytes(COMM_BF16) == 2 && comm_dtype_bytes((CommDtype)9) == 0,
          "dtype sizes");
}

/* ---- the collectives ---- */

/* The contract's result at element i: inputs of members in order, in fp32, rounded once. */
static uint16_t expected_at(const int *members, int n, size_t i, int tag, CommOp op) {
    float acc = tp_bf16_to_f32(vb(members[0], i, tag));
    for (int q = 1; q < n; q++) {
        const float x = tp_bf16_to_f32(vb(members[q], i, tag));
        acc = op == COMM_SUM ? acc + x : (x > acc ? x : acc);
    }
    return tp_f32_to_bf16(acc);
}

/* The wrong semantics (rounding after every addition), for the discrimination check. */
static uint16_t rounded_each_step(const int *members, int n, size_t i, int tag) {
    float acc = tp_bf16_to_f32(vb(members[0], i, tag));
    for (int q = 1; q < n; q++) acc = tp_bf16_round(acc + tp_bf16_to_f32(vb(members[q], i, tag)));
    return tp_f32_to_bf16(acc);
}

static void check_allreduce_bf16(Comm *c, int fd, int rank, size_t n_elems, int tag, CommOp op) {
    const int n = comm_size(c);
    int members[MAX_RANKS];
    for (int q = 0; q < n; q++) members[q] = q;
    uint16_t *buf = alloc_bf16(n_elems);
    for (size_t i = 0; i < n_elems; i++) buf[i] = vb(rank, i, tag);
    CHECK(comm_allreduce_t(c, buf, n_elems, COMM_BF16, op) == 0, "bf16 allreduce %zu: %s", n_elems, comm_error(c));
    size_t bad = 0, first = 0, step_differs = 0;
    for (size_t i = 0; i < n_elems; i++) {
        const uint16_t want = expected_at(members, n, i, tag, op);
        if (buf[i] != want && bad++ == 0) first = i;
        if (op == COMM_SUM) step_differs += rounded_each_step(members, n, i, tag) != want;
    }
    CHECK(bad == 0, "bf16 allreduce %s of %zu: %zu elements differ (first [%zu]: got %04x want %04x)",
          op == COMM_SUM ? "sum" : "max", n_elems, bad, first, bad ? buf[first] : 0,
          bad ? expected_at(members, n, first, tag, op) : 0);
    if (op == COMM_SUM && n >= 3 && n_elems >= 1000)
        CHECK(step_differs > 0, "bf16 sum of %zu: rounding once and at every step agree everywhere (weak data)",
              n_elems);
    emit(fd, "bf16 allreduce %d %zu = %016llx", (int)op, n_elems,
         (unsigned long long)checksum(buf, n_elems * sizeof(uint16_t)));
    free(buf);
}

static void rank_bf16(int rank, int n, int fd, void *arg) {
    (void)arg;
    Comm *c = create_or_report("bf16", rank, n, 20.0);
    if (!c) return;
    const size_t sizes[] = {0, 1, 7, BF16_DIRECT_ELEMS, BF16_DIRECT_ELEMS + 1, 100003, 2 * BF16_CHUNK_ELEMS + 5};
    const int n_sizes = (int)(sizeof sizes / sizeof sizes[0]);
    double ar_bytes = 0;
    for (int s = 0; s < n_sizes; s++) {
        for (int op = 0; op < 2; op++) {
            check_allreduce_bf16(c, fd, rank, sizes[s], 10 * s + op, (CommOp)op);
            ar_bytes += (double)sizes[s] * 2;
        }
        // An fp32 call between bf16 ones: the slot sets alternate whatever the dtype.
        float f[3] = {(float)rank, 1.0f, -2.0f};
        CHECK(comm_allreduce(c, f, 3, COMM_SUM) == 0 && f[0] == (float)(n * (n - 1) / 2) && f[1] == (float)n,
              "fp32 between bf16: %s", comm_error(c));
        ar_bytes += 12;
    }

    // MAX propagates NaN in bf16 too.
    uint16_t x[3] = {bits_of(1.0f), bits_of((float)rank), bits_of(-4.0f)};
    if (rank == n - 1) x[0] = bits_of(NAN);
    CHECK(comm_allreduce_t(c, x, 3, COMM_BF16, COMM_MAX) == 0, "bf16 nan max: %s", comm_error(c));
    CHECK(isnan(tp_bf16_to_f32(x[0])) && tp_bf16_to_f32(x[1]) == (float)(n - 1), "bf16 nan max: %g %g",
          tp_bf16_to_f32(x[0]), tp_bf16_to_f32(x[1]));
    ar_bytes += 6;

    // reduce_scatter: out[i] = the rank-order fp32 sum of q's in[rank * m + i], rounded once.
    const size_t rs_sizes[] = {0, 1, 7, 100003, BF16_CHUNK_ELEMS / 2 + 5};
    for (int s = 0; s < 5; s++) {
        const size_t m = rs_sizes[s];
        uint16_t *in = alloc_bf16((size_t)n * m), *out = alloc_bf16(m);
        for (size_t i = 0; i < (size_t)n * m; i++) in[i] = vb(rank, i, 100 + s);
        CHECK(comm_reduce_scatter_t(c, in, out, m, COMM_BF16) == 0, "bf16 reduce_scatter %zu: %s", m, comm_error(c));
        int members[MAX_RANKS];
        for (int q = 0; q < n; q++) members[q] = q;
        size_t bad = 0;
        for (size_t i = 0; i < m; i++)
            bad += out[i] != expected_at(members, n, (size_t)rank * m + i, 100 + s, COMM_SUM);
        CHECK(bad == 0, "bf16 reduce_scatter %zu: %zu elements differ", m, bad);
        free(in);
        free(out);
    }

    // allgather: rank q's in lands at out + q * m, bits unchanged.
    const size_t ag_sizes[] = {0, 1, 7, BF16_CHUNK_ELEMS + 5};
    for (int s = 0; s < 4; s++) {
        const size_t m = ag_sizes[s];
        uint16_t *in = alloc_bf16(m), *out = alloc_bf16((size_t)n * m);
        for (size_t i = 0; i < m; i++) in[i] = vb(rank, i, 200 + s);
        CHECK(comm_allgather_t(c, in, out, m, COMM_BF16) == 0, "bf16 allgather %zu: %s", m, comm_error(c));
        size_t bad = 0;
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < m; i++) bad += out[(size_t)q * m + i] != vb(q, i, 200 + s);
        CHECK(bad == 0, "bf16 allgather %zu: %zu elements differ", m, bad);
        emit(fd, "bf16 allgather %zu = %016llx", m, (unsigned long long)checksum(out, (size_t)n * m * 2));
        free(in);
        free(out);
    }

    CommStats st = comm_stats(c);
    CHECK(st.allreduce == 2 * n_sizes + n_sizes + 1 && st.reduce_scatter == 5 && st.allgather == 4, "stats %ld %ld %ld",
          st.allreduce, st.reduce_scatter, st.allgather);
    CHECK(st.allreduce_bytes == ar_bytes, "allreduce bytes %.0f want %.0f (bf16 counts 2 bytes)", st.allreduce_bytes,
          ar_bytes);

    // An unknown dtype is refused by name and poisons the group (every rank makes the same bad call).
    uint16_t y[2] = {0, 0};
    CHECK(comm_allreduce_t(c, y, 2, (CommDtype)7, COMM_SUM) == -1 && strstr(comm_error(c), "unknown dtype 7"),
          "unknown dtype: %s", comm_error(c));
    CHECK(comm_barrier(c) == -1, "a poisoned group still works");
    comm_free(c);
}

int main(void) {
    init_job("td");
    check_conversions();
    run_world_sizes("bf16", 4, rank_bf16, NULL);
    return check_report("test_comm_dtype");
}
