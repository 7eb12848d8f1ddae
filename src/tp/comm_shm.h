/* comm_shm.h: the shared-memory backend of comm.h (one host).
 *
 * Group rank 0 creates a POSIX shared-memory segment named from the job id
 * and the group name and writes the job id into it last; the others open it
 * (retrying until the timeout) and check the id, so a stale segment left by
 * a killed job is never joined. The last member to attach unlinks the name:
 * from then on nothing is left in /dev/shm whatever happens to the job. A
 * job killed while its groups form leaves its segments named; they carry
 * their creator's pid (shm_reclaim.h), and the next rank 0 to create one,
 * or the next tprun, removes those whose creator is dead.
 * Each rank's pid is in the segment: a waiting rank notices a dead peer
 * (kill(pid, 0) fails) and errors at once instead of waiting for the timeout.
 * Buffers are host memory, or device memory once comm_set_device_copy has
 * given the hooks that stage them (comm.h). Layout: comm_shm_impl.h.
 */
#ifndef TPTRAIN_COMM_SHM_H
#define TPTRAIN_COMM_SHM_H

#include <stddef.h>
#include "tp/comm.h"

/* job_id: unique per job (tprun passes one); group: e.g. "world", "tp0",
 * "dp1". timeout_s bounds every wait (rendezvous and collectives).
 * NULL + err on failure. */
Comm *comm_shm_create(const char *job_id, const char *group, int rank, int size, double timeout_s, char *err,
                      size_t err_len);

/* The page-locked host staging buffer one member of a staged group of
 * group_size ranks makes (on its first call; the backend's host_alloc tags
 * it "comm"): 4 MiB with peers, none alone (a group of one only copies in
 * place of a reduce-scatter or allgather, and stages only then). The
 * planner predicts staging with this function, the group allocates with it. */
size_t comm_shm_stage_bytes(int group_size);

#endif
