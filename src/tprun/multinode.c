/* multinode.c: the agents of a job on several nodes: the rendezvous
 * through the store (join_nodes), waiting on the job's counters while the
 * heartbeats go on (wait_counter), and the end every node agrees on
 * (finish_nodes); nodes_free frees what the rendezvous allocated.
 * --max_restarts needs a single node.
 *
 * Calls: workers.c's poll_job and publish_failure (tprun_internal.h), the
 * store client (tp/store.h), common/.
 */
#define _GNU_SOURCE
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clock.h"
#include "err.h"
#include "tp/store.h"
#include "tprun/tprun_internal.h"

/* ---- multi-node coordination ------------------------------------------------ */

/* Waits until counter `key` reaches `n`. 1 reached; 0 on timeout, on a
 * terminating signal (*sig), or (watch) when the job failed (report).
 * Heartbeats go on meanwhile. */
int wait_counter(Agent *a, const char *key, long n, double timeout_s, int watch, int *sig, char *report,
                 size_t report_len) {
    double deadline = tp_now_s() + timeout_s;
    for (;;) {
        long v = 0;
        if (store_add(a->store, key, 0, &v) == 0 && v >= n) return 1;
        if (watch && poll_job(a, report, report_len)) return 0;
        if (tp_now_s() >= deadline) return 0;
        struct pollfd pfd = {.fd = g_sig_pipe[0], .events = POLLIN};
        double wake = tp_now_s() + STORE_POLL_S;
        if (poll(&pfd, 1, ms_until(wake < deadline ? wake : deadline)) > 0) {
            unsigned char sigs[64];
            ssize_t ns;
            while ((ns = read(g_sig_pipe[0], sigs, sizeof sigs)) > 0)
                for (ssize_t k = 0; k < ns; k++)
                    if (sigs[k] != SIGCHLD && !*sig) *sig = sigs[k];
            while (waitpid(-1, NULL, WNOHANG) > 0) {
            }
            if (*sig) return 0;
        }
    }
}

/* Node rendezvous: every agent joins, nproc_per_node must agree, and the
 * job id is node 0's. 0 or -1 (message printed). */
int join_nodes(Agent *a) {
    const Opts *o = &a->o;
    char err[512];
    a->store = store_connect(o->master_addr, a->port, a->token, JOIN_TIMEOUT_S, err, sizeof err);
    if (!a->store) {
        fprintf(stderr, "tprun: node %d: %s\n", o->node_rank, err);
        return -1;
    }
    char key[64], val[400];
    snprintf(key, sizeof key, "tprun/node/%d", o->node_rank);
    snprintf(val, sizeof val, "%d %s", o->nproc, a->host);
    if (o->node_rank == 0 && store_set(a->store, "tprun/job_id", a->job_base, strlen(a->job_base)) != 0) goto fail;
    if (store_set(a->store, key, val, strlen(val)) != 0) goto fail;
    if (store_barrier(a->store, "tprun/join", o->nnodes, JOIN_TIMEOUT_S) != 0) goto fail;
    a->node_host = TP_CALLOC((size_t)o->nnodes, sizeof *a->node_host);
    a->hb_seen = TP_CALLOC((size_t)o->nnodes, sizeof *a->hb_seen);
    a->hb_when = TP_CALLOC((size_t)o->nnodes, sizeof *a->hb_when);
    for (int r = 0; r < o->nnodes; r++) {
        snprintf(key, sizeof key, "tprun/node/%d", r);
        char *v = store_get(a->store, key, NULL, 10.0);
        if (!v) goto fail;
        snprintf(a->node_host[r], sizeof a->node_host[r], "%s", strchr(v, ' ') ? strchr(v, ' ') + 1 : "?");
        int their = atoi(v);
        if (their != o->nproc) {
            fprintf(stderr, "tprun: node %d runs --nproc_per_node %d but node %d (%s) runs %d; they must agree\n",
                    o->node_rank, o->nproc, r, strchr(v, ' ') ? strchr(v, ' ') + 1 : "?", their);
            free(v);
            return -1;
        }
        free(v);
    }
    if (o->node_rank > 0) {
        char *id = store_get(a->store, "tprun/job_id", NULL, 10.0);
        if (!id) goto fail;
        snprintf(a->job_base, sizeof a->job_base, "%s", id);
        free(id);
    }
    return 0;
fail:
    fprintf(stderr, "tprun: node %d could not join the job: %s\n", o->node_rank, store_error(a->store));
    return -1;
}

void nodes_free(Agent *a) {
    free(a->node_host);
    free(a->hb_seen);
    free(a->hb_when);
}

/* Several nodes: this node's success still needs every node's success;
 * then every agent acknowledges and node 0 keeps the store up until all
 * have. Returns the exit status. */
int finish_nodes(Agent *a, const Outcome *out, int sig, int code) {
    const Opts *o = &a->o;
    char report[1024];
    if (out->kind == OUT_OK && !sig) {
        long dummy;
        store_add(a->store, "tprun/done", 1, &dummy);
        if (wait_counter(a, "tprun/done", o->nnodes, INFINITY, 1, &sig, report, sizeof report) != 1) {
            if (sig) {
                fprintf(stderr, "tprun: received %s while waiting for the other nodes\n", signal_name(sig));
                snprintf(report, sizeof report, "tprun on host %s (node %d) was stopped by %s", a->host,
                         o->node_rank, signal_name(sig));
                publish_failure(a, report);
                code = 128 + sig;
            } else {
                fprintf(stderr, "tprun: node %d finished, but the job failed: %s\n", o->node_rank, report);
                code = 1;
            }
        }
    }
    long dummy;
    store_add(a->store, "tprun/exited", 1, &dummy);
    if (o->node_rank == 0) {
        int ignored = 0;
        wait_counter(a, "tprun/exited", o->nnodes - a->n_silent, o->grace + 5.0, 0, &ignored, report, sizeof report);
    }
    return code;
}
