/* mesh.h: world -> (tp, dp, pp) coordinates and the rank lists of groups.
 * Megatron's order: tp varies fastest, then dp, then pp:
 *   rank = tp_rank + tp * (dp_rank + dp * pp_rank). */
#ifndef TPTRAIN_MESH_H
#define TPTRAIN_MESH_H

#include <stddef.h>

typedef struct {
    int world, rank;
    int tp, dp, pp;                 // sizes
    int tp_rank, dp_rank, pp_rank;  // this rank's coordinates
} Mesh;

/* Validates world == tp * dp * pp (all >= 1) and 0 <= rank < world, fills
 * coordinates. 0 or -1 with one sentence in err. Model-dependent checks
 * (heads % tp, padded vocab % tp) are in mesh_check_model. */
int mesh_init(Mesh *m, int world, int rank, int tp, int dp, int pp, char *err, size_t err_len);
int mesh_check_model(const Mesh *m, int n_heads, int d_ff, int vocab_padded, char *err, size_t err_len);

/* Ranks of this rank's tp / dp / pp group, in group-rank order (arrays of
 * tp / dp / pp entries). */
void mesh_tp_group(const Mesh *m, int *ranks);
void mesh_dp_group(const Mesh *m, int *ranks);
void mesh_pp_group(const Mesh *m, int *ranks);
int mesh_rank_of(const Mesh *m, int tp_rank, int dp_rank, int pp_rank);

#endif
