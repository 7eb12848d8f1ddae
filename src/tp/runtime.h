/* runtime.h: one rank's view of a parallel job: where it sits in the mesh
 * and the communicators of its groups.
 *
 * Under tprun the environment gives RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE and TPRUN_JOB_ID; without it the process is a world of
 * one. Layout: tp and dp as asked; 0 means automatic: tensor parallel inside
 * a node (tp = ranks per node, lowered until it divides the heads, d_ff and
 * the world), data parallel across the rest.
 */
#ifndef TPTRAIN_RUNTIME_H
#define TPTRAIN_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include "tp/comm.h"
#include "tp/mesh.h"

typedef struct {
    Mesh mesh;
    int local_rank, local_world;
    bool launched;            // started by tprun (or another torchrun-style launcher)
    char job_id[64];
    Comm *world, *tp, *dp;    // this rank's groups (size-1 groups are cheap)
} Runtime;

/* 0, or -1 with one sentence in err (bad environment, invalid layout,
 * rendezvous failure). */
int runtime_init(Runtime *rt, int tp, int dp, int n_heads, int d_ff, double timeout_s, char *err, size_t err_len);
void runtime_free(Runtime *rt);

/* Picks tp for `auto`: the largest t <= local_world dividing world, n_heads and d_ff. */
int runtime_auto_tp(int world, int local_world, int n_heads, int d_ff);

#endif
