/* tprun_internal.h: what the launcher's pieces share: its timings, its
 * options (Opts), the agent and its workers, an attempt's outcome, and the
 * functions one piece calls in another: tprun.c (options, set-up, main),
 * workers.c (an attempt), signals.c, multinode.c. Nothing outside
 * src/tprun includes it.
 */
#ifndef TPTRAIN_TPRUN_INTERNAL_H
#define TPTRAIN_TPRUN_INTERNAL_H

#include <stdint.h>
#include <sys/types.h>

#include "tp/store.h"

#define STORE_POLL_S 0.2        // how often an agent of a multi-node job checks the failure flag
#define GROUP_TICK_S 0.05       // re-check of process groups that outlive their leader
#define DRAIN_S 1.0             // how long to wait for pipe EOF once every process is gone
#define JOIN_TIMEOUT_S 300.0    // multi-node rendezvous of the agents
#define HEARTBEAT_TIMEOUT_S 30.0 // node 0 declares a silent agent of another node dead
#define LINE_MAX_BYTES (1 << 20) // a longer line is cut and printed in pieces
#define FAILURE_SETTLE_S 0.5     // after the first failure, how long other ranks already on their way out are
                                 // let finish before SIGTERM: the first error among them is the one named
#define SIGNAL_PAUSE_S 2.0       // a repeated signal within this of the first is the same request (timeout(1)
                                 // delivers twice, to tprun and to its process group); later, or a second
                                 // Ctrl-C at a terminal, it means SIGKILL now
#define SEEN_LINES_MAX 4096      // stderr lines remembered to show a line several ranks print only once

typedef struct {
    int nproc, nnodes, node_rank, master_port;  // master_port -1 = not given
    const char *nproc_word;  // --nproc_per_node gpu|auto, resolved after parsing; NULL = a number
    int given_nnodes, given_node_rank;  // on the command line (SLURM's values fill the others)
    int standalone, max_restarts, tee;
    double grace;
    const char *master_addr;  // NULL = not given
    const char *log_dir;
    char **prog_argv;  // PROGRAM ARGS..., NULL-terminated
} Opts;

typedef struct {
    int fd;  // -1 = closed
    int is_err;
    char *buf;
    size_t len, cap;
} Stream;

typedef struct {
    int local_rank, rank;
    pid_t pid;    // also the process group id; 0 = never started
    int running;  // not yet reaped
    int status;   // wait status once reaped
    int group_alive;
    Stream out, err;
    int log_fd;
    char **envp;
    /* the order of events: the last stderr line this worker wrote, its
     * reaping (a failure is named by when its error came, see pick_failure) */
    unsigned long last_err_seq, reaped_seq;
} Worker;

typedef struct {
    Opts o;
    char host[256];
    char *program;  // resolved path
    char token[65];
    char job_base[17];
    int port;       // the store's real port
    StoreServer *server;
    StoreClient *store;  // multi-node only
    char (*node_host)[256];       // multi-node: host of every node (from the rendezvous)
    long *hb_seen;                // node 0: last heartbeat count of every node
    double *hb_when;              // node 0: when it last changed
    int n_silent;                 // node 0: agents declared dead (no acknowledgement to wait for)
    unsigned long seq;            // events so far: stderr lines read, workers reaped
    struct { uint64_t hash; int rank; } *seen;  // stderr lines shown this attempt (SEEN_LINES_MAX)
    int n_seen;
    int dev_null;
    Worker *w;
} Agent;

typedef enum { OUT_OK, OUT_FAILED, OUT_REMOTE } OutcomeKind;

typedef struct {
    OutcomeKind kind;   // OUT_FAILED: a local worker failed first; OUT_REMOTE: the job failed elsewhere
    int sig;            // a terminating signal tprun received (0 = none)
    double sig_at;      // when (tp_now_s), for telling a second request from a duplicate delivery
    int repeats_told;   // a duplicate delivery has been reported
    int saved_on_signal;  // every worker exited 0 or TP_EXIT_SAVED_ON_SIGNAL, some the latter
    int status;         // OUT_FAILED: the wait status of the rank named
    char report[1024];  // "rank R (local rank L, pid P) on host H failed first: ..." (or exited 0 early: ...)
} Outcome;

/* ---- signals.c ---- */
extern int g_sig_pipe[2];  // written by the handler, read by the loop: process-wide by nature
int install_signals(void);
void restore_inherited_signals(void);
const char *signal_name(int sig);

/* ---- workers.c ---- */
int ms_until(double deadline);
void publish_failure(Agent *a, const char *report);
int poll_job(Agent *a, char *report, size_t n);
void run_attempt(Agent *a, int restart, Outcome *out);

/* ---- multinode.c ---- */
int wait_counter(Agent *a, const char *key, long n, double timeout_s, int watch, int *sig, char *report,
                 size_t report_len);
int join_nodes(Agent *a);
/* Frees what join_nodes allocated (the hosts, the heartbeats); none: nothing. */
void nodes_free(Agent *a);
int finish_nodes(Agent *a, const Outcome *out, int sig, int code);

#endif
