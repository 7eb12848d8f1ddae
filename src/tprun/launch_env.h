/* launch_env.h: what tprun reads from the machine and the scheduler, apart
 * from its flags: the GPUs it may give workers (--nproc_per_node gpu|auto)
 * and, inside a SLURM allocation, the node count, this node's rank and the
 * master host (SLURM_NNODES, SLURM_NODEID, the first host of
 * SLURM_JOB_NODELIST).
 *
 * Why a file of its own: the nodelist grammar and the GPU count are pure
 * functions of strings that a unit test (test_launch_env) can drive with
 * every odd case, without a scheduler or a GPU; tprun.c only wires them.
 */
#ifndef TPTRAIN_LAUNCH_ENV_H
#define TPTRAIN_LAUNCH_ENV_H

#include <stddef.h>

#define NODELIST_MAX_HOSTS 65536  // a longer expansion is refused (a typo such as [1-99999999])
#define HOSTNAME_MAX 256

/* Expands a SLURM hostlist ("gpu[01-04]", "a[1,3-5],b7", "n[1-2]-ib[0-1]")
 * into *hosts (malloc'ed array of malloc'ed names, in SLURM's order; zero
 * padding kept: the width of a range is its lower bound's). Returns the
 * count (>= 1), or -1 with a one-line reason in err. */
int nodelist_expand(const char *list, char ***hosts, char *err, size_t err_len);
void nodelist_free(char **hosts, int n);

/* The GPUs a process started here would see: the entries of
 * CUDA_VISIBLE_DEVICES (cvd, NULL = unset) up to the first one CUDA would
 * stop at (an index not below n_smi, or not a number or GPU-/MIG- id),
 * else n_smi (the GPUs nvidia-smi -L lists). An empty cvd hides every GPU. */
int visible_gpu_count(const char *cvd, int n_smi);

/* The GPUs `nvidia-smi -L` (found along PATH) lists: lines starting "GPU ";
 * 0 when it is missing or fails. */
int nvidia_smi_gpu_count(void);

#endif
