/* mesh.c: world rank <-> (tp, dp, pp) coordinates, Megatron's order.
 *
 * Pure arithmetic on one formula, rank = tp_rank + tp * (dp_rank + dp *
 * pp_rank), so that every module (comm groups, data split, checkpoint
 * shards) derives its groups from the same place. Layout errors are user
 * input: they come back as one sentence, never as an abort.
 */
#include "tp/mesh.h"

#include "err.h"

int mesh_init(Mesh *m, int world, int rank, int tp, int dp, int pp, char *err, size_t err_len) {
    if (world < 1) {
        tp_error_set(err, err_len, "the world size (%d) must be at least 1", world);
        return -1;
    }
    const char *names[3] = {"tp", "dp", "pp"};
    const int sizes[3] = {tp, dp, pp};
    for (int i = 0; i < 3; i++) {
        if (sizes[i] < 1) {
            tp_error_set(err, err_len, "%s (%d) must be at least 1", names[i], sizes[i]);
            return -1;
        }
    }
    long long product = (long long)tp * dp * pp;
    if (product != world) {
        tp_error_set(err, err_len, "tp (%d) x dp (%d) x pp (%d) = %lld does not match the world size %d", tp, dp,
                     pp, product, world);
        return -1;
    }
    if (rank < 0 || rank >= world) {
        tp_error_set(err, err_len, "rank %d is outside the world of size %d", rank, world);
        return -1;
    }
    *m = (Mesh){.world = world, .rank = rank, .tp = tp, .dp = dp, .pp = pp,
                .tp_rank = rank % tp, .dp_rank = (rank / tp) % dp, .pp_rank = rank / (tp * dp)};
    return 0;
}

int mesh_check_model(const Mesh *m, int n_heads, int d_ff, int vocab_padded, char *err, size_t err_len) {
    if (n_heads < 1 || d_ff < 1 || vocab_padded < 1) {
        tp_error_set(err, err_len, "n_heads (%d), d_ff (%d) and the padded vocabulary (%d) must be positive",
                     n_heads, d_ff, vocab_padded);
        return -1;
    }
    if (n_heads % m->tp != 0) {
        tp_error_set(err, err_len, "n_heads (%d) is not divisible by tp (%d)", n_heads, m->tp);
        return -1;
    }
    if (d_ff % m->tp != 0) {
        tp_error_set(err, err_len, "d_ff (%d) is not divisible by tp (%d)", d_ff, m->tp);
        return -1;
    }
    if (vocab_padded % m->tp != 0) {
        tp_error_set(err, err_len, "the padded vocabulary (%d) is not divisible by tp (%d)", vocab_padded, m->tp);
        return -1;
    }
    return 0;
}

int mesh_rank_of(const Mesh *m, int tp_rank, int dp_rank, int pp_rank) {
    return tp_rank + m->tp * (dp_rank + m->dp * pp_rank);
}

void mesh_tp_group(const Mesh *m, int *ranks) {  // (tp)
    for (int i = 0; i < m->tp; i++) ranks[i] = mesh_rank_of(m, i, m->dp_rank, m->pp_rank);
}

void mesh_dp_group(const Mesh *m, int *ranks) {  // (dp)
    for (int i = 0; i < m->dp; i++) ranks[i] = mesh_rank_of(m, m->tp_rank, i, m->pp_rank);
}

void mesh_pp_group(const Mesh *m, int *ranks) {  // (pp)
    for (int i = 0; i < m->pp; i++) ranks[i] = mesh_rank_of(m, m->tp_rank, m->dp_rank, i);
}
