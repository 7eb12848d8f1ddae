/* tprun.c: the launcher, torchrun's flags and worker environment: its
 * options, the agent's set-up and main. The workers of an attempt are in
 * workers.c, the signals in signals.c, several nodes in multinode.c;
 * tprun_internal.h holds what they share. Calls: those, the store
 * (tp/store.h), shm_reclaim, launch_env.c, common/.
 *
 *   tprun [--nproc_per_node N|gpu|auto] [--nnodes N] [--node_rank R] [--master_addr A]
 *         [--master_port P] [--standalone] [--max_restarts N] [--log_dir DIR]
 *         [--tee 0|1|2|3] [--grace S] PROGRAM [ARGS...]
 *
 * Why this shape: one agent process per node, single-threaded apart from the
 * store server thread (node 0 only). Everything the agent waits for, worker
 * output pipes and signals (SIGCHLD, SIGINT, SIGTERM, ... turned into bytes
 * on a self-pipe by a tiny handler), goes through one poll() loop whose
 * timeout is the next deadline: the SIGKILL deadline after a SIGTERM, the
 * 200 ms check of the job's failure flag with several nodes, or a short
 * tick while a finished worker's process group still has members. Nothing
 * spins.
 *
 * Failure and shutdown: every worker leads its own process group, so
 * SIGTERM/SIGKILL go to the group and reach the worker's children too; the
 * agent is a child subreaper, so grandchildren orphaned by a dead worker are
 * re-parented to it and reaped: no zombie or orphan survives any path. The
 * first non-zero exit or death by signal opens a short window
 * (FAILURE_SETTLE_S) for ranks already on their way out; of the failures by
 * then, the one whose error line came first is "the failure" (a rank that
 * printed the cause and took a moment to exit, not the peer that died of
 * its absence sooner): the others get SIGTERM, after --grace seconds
 * SIGKILL, then the report, and tprun exits with that rank's exit status
 * (128 + signal for a death by signal), as torchrun does. A stderr line
 * several ranks print identically is shown once. A worker that
 * exited 0 while others still ran is named first in that report: its peers
 * usually fail because it is gone. Signals sent to
 * tprun are forwarded to every worker group (a second one means SIGKILL now,
 * when it is a deliberate second request: SIGNAL_PAUSE_S or more after the
 * first, or a second SIGINT typed at a terminal; a duplicate delivery, as
 * timeout(1) makes, is the same request) and tprun exits 128+signal, or 75 when every worker ended without failure
 * and some exited 75, "saved on signal" (train_mt's preemption: a worker
 * exiting 75 is no failure). Should tprun itself be SIGKILLed, its workers
 * get SIGKILL from the kernel (PR_SET_PDEATHSIG); their own children are
 * then beyond its reach. Between the fork and the exec a child only
 * makes async-signal-safe calls (the store thread may hold locks), so each
 * worker's environment is built before the fork.
 *
 * Several nodes: node 0 hosts the store and every agent connects to it. The
 * agents rendezvous ("tprun/node/<r>" then a barrier), the first failure
 * anywhere is published under "tprun/failed" (its report as the value) and
 * every agent polls that key; the agents also count "tprun/done" and
 * "tprun/exited", so node 0 keeps the store up until the others have seen
 * the outcome. --max_restarts needs a single node.
 *
 * TPRUN_JOB_ID changes with every restart: shared-memory names and store
 * keys derived from it never meet leftovers of the killed attempt (the store
 * itself lives on across restarts).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "err.h"
#include "flags.h"
#include "parse.h"
#include "tprun/launch_env.h"
#include "tp/threads.h"
#include "tp/shm_reclaim.h"
#include "tp/store.h"
#include "tprun/tprun_internal.h"

/* ---- options -------------------------------------------------------------- */
/* --nproc_per_node N|gpu|auto: a word is resolved after parsing (resolve_nproc). */
static int set_nproc(void *args, const Flag *f, const char *s, double num, char *err, size_t err_len) {
    (void)f, (void)num;
    Opts *o = args;
    o->nproc_word = strcmp(s, "gpu") == 0 || strcmp(s, "auto") == 0 ? s : NULL;
    long v;
    if (o->nproc_word) return 0;
    if (parse_int("--nproc_per_node", s, 1, 4096, &v, err, err_len)) return -1;
    o->nproc = (int)v;
    return 0;
}
static void show_nproc(const void *args, const Flag *f, char *buf, size_t len) {
    (void)f;
    const Opts *o = args;
    if (o->nproc_word) snprintf(buf, len, "%s", o->nproc_word);
    else snprintf(buf, len, "%d", o->nproc);
}

static const Flag TPRUN_FLAGS[] = {
    {.name = "nproc_per_node", .kind = FLAG_STRING, .group = "Workers", .metavar = "N|gpu|auto", .dflt = "1",
     .set = set_nproc, .show = show_nproc,
     .help = "workers on this node, 1 to 4096; gpu: one per visible GPU (nvidia-smi -L, CUDA_VISIBLE_DEVICES "
             "honoured); auto: the GPUs if any, else the CPU cores"},
    {.name = "max_restarts", .kind = FLAG_INT, .group = "Workers", .metavar = "N", .lo = 0, .hi = 1000000,
     .dflt = "0", FLAG_AT(Opts, max_restarts),
     .help = "after a worker fails, restart all workers up to N times (a single node)"},
    {.name = "grace", .kind = FLAG_REAL, .group = "Workers", .metavar = "S", .lo = 0.0, .hi = 86400.0,
     .dflt = "5", FLAG_AT(Opts, grace), .help = "seconds between SIGTERM and SIGKILL when the workers are stopped"},
    {.name = "nnodes", .kind = FLAG_INT, .group = "Nodes", .metavar = "N", .lo = 1, .hi = 65536,
     .dflt_note = "1, or SLURM_NNODES", FLAG_AT(Opts, nnodes), .help = "nodes of the job, one tprun on each"},
    {.name = "node_rank", .kind = FLAG_INT, .group = "Nodes", .metavar = "R", .lo = 0, .hi = 65535,
     .dflt_note = "0, or SLURM_NODEID", FLAG_AT(Opts, node_rank), .help = "this node's rank"},
    {.name = "master_addr", .kind = FLAG_STRING, .group = "Nodes", .metavar = "A", FLAG_AT(Opts, master_addr),
     .dflt_note = "127.0.0.1, or the first host of SLURM_JOB_NODELIST", .help = "node 0's address (the store)"},
    {.name = "master_port", .kind = FLAG_INT, .group = "Nodes", .metavar = "P", .lo = 0, .hi = 65535,
     .dflt_note = "a free port on one node, 29500 with several", FLAG_AT(Opts, master_port),
     .help = "the store's port"},
    {.name = "standalone", .kind = FLAG_SWITCH, .group = "Nodes", FLAG_AT(Opts, standalone),
     .help = "one node, the store on a free port (SLURM's variables ignored)"},
    {.name = "log_dir", .kind = FLAG_STRING, .group = "Output", .metavar = "DIR", FLAG_AT(Opts, log_dir),
     .help = "each rank's output also in DIR/rank_R.log"},
    {.name = "tee", .kind = FLAG_INT, .group = "Output", .metavar = "0|1|2|3", .lo = 0, .hi = 3, .dflt = "0",
     FLAG_AT(Opts, tee),
     .help = "with --log_dir, the streams that also go to the terminal: 1 stdout, 2 stderr, 3 both (torchrun's --tee)"},
};

static const FlagTable TPRUN_TABLE = {
    .prog = "tprun",
    .usage = "usage: tprun [--nproc_per_node N|gpu|auto] [--nnodes N] [--node_rank R] [--master_addr A]\n"
             "             [--master_port P] [--standalone] [--max_restarts N] [--log_dir DIR]\n"
             "             [--tee 0|1|2|3] [--grace S] PROGRAM [ARGS...]\n"
             "Starts nproc_per_node copies of PROGRAM (looked up next to tprun, then in PATH) with\n"
             "RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,\n"
             "TPRUN_TOKEN and TPRUN_JOB_ID set. With --nnodes > 1, every node needs the same\n"
             "TPRUN_TOKEN in its environment. Flags take --flag=value or --flag value, with '_' or '-'.\n",
    .epilog = "Inside a SLURM allocation --nnodes, --node_rank and --master_addr default to SLURM_NNODES,\n"
              "SLURM_NODEID and the first host of SLURM_JOB_NODELIST.\n"
              "SIGINT, SIGTERM and SIGUSR1 are forwarded to the workers. A second signal 2 s or more after\n"
              "the first, or a second Ctrl-C at a terminal, sends SIGKILL now; one within 2 s of the first\n"
              "(timeout(1) delivers twice) is the same request.\n"
              "Exit status: 0; 75 when every worker ended with 0 or 75 (\"saved on signal\") and some with\n"
              "75; 128+signal when tprun was signalled; 1 when a worker failed.\n",
    .flags = TPRUN_FLAGS,
    .n = sizeof TPRUN_FLAGS / sizeof TPRUN_FLAGS[0],
    .options = FLAGS_UNDERSCORE | FLAGS_STOP | FLAGS_DASH_H,
};

/* Numbers of the environment through the project's strict parser (common/parse.h). */
static int env_int(const char *name, const char *v, int lo, int hi, int *out) {
    char err[256];
    long x;
    if (parse_int(name, v, lo, hi, &x, err, sizeof err)) {
        fprintf(stderr, "tprun: %s\n", err);
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* --nproc_per_node gpu|auto into a count, said on stderr. 0 or -1 (printed). */
static int resolve_nproc(Opts *o) {
    if (!o->nproc_word) return 0;
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    const int n_smi = nvidia_smi_gpu_count();
    const int n_gpu = visible_gpu_count(cvd, n_smi);
    char seen[256];
    snprintf(seen, sizeof seen, "nvidia-smi -L lists %d GPU%s%s%.100s%s", n_smi, n_smi == 1 ? "" : "s",
             cvd ? ", CUDA_VISIBLE_DEVICES='" : "", cvd ? cvd : "", cvd ? "'" : "");
    if (n_gpu > 0) {
        o->nproc = n_gpu;
        fprintf(stderr, "tprun: --nproc_per_node=%s: %d worker%s, one per visible GPU (%s)\n", o->nproc_word, n_gpu,
                n_gpu == 1 ? "" : "s", seen);
        return 0;
    }
    if (strcmp(o->nproc_word, "gpu") == 0) {
        fprintf(stderr, "tprun: --nproc_per_node=gpu: no GPU is visible (%s); give a number or 'auto'\n", seen);
        return -1;
    }
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    o->nproc = cores > 0 ? (cores < 4096 ? (int)cores : 4096) : 1;
    fprintf(stderr, "tprun: --nproc_per_node=auto: no GPU visible (%s): %d worker%s, one per CPU core\n", seen,
            o->nproc, o->nproc == 1 ? "" : "s");
    return 0;
}

/* Inside a SLURM allocation (SLURM_JOB_ID and SLURM_NNODES set): what the
 * command line left open of --nnodes, --node_rank and --master_addr, from
 * SLURM's variables. 0 or -1 (printed). */
static int from_slurm(Opts *o) {
    const char *job = getenv("SLURM_JOB_ID"), *nn = getenv("SLURM_NNODES");
    if (!job || !*job || !nn || !*nn) return 0;
    if (o->given_nnodes && o->given_node_rank && o->master_addr) return 0;
    const char *id = getenv("SLURM_NODEID"), *list = getenv("SLURM_JOB_NODELIST");
    if (!list || !*list) list = getenv("SLURM_NODELIST");
    const char *local = getenv("SLURM_LOCALID");
    if (local && strcmp(local, "0") != 0) {
        fprintf(stderr, "tprun: SLURM started this tprun as task %s of its node: run one tprun per node "
                        "(srun --ntasks-per-node=1), it starts the node's workers itself\n", local);
        return -1;
    }
    int nnodes, node_rank = 0;
    if (env_int("SLURM_NNODES", nn, 1, 65536, &nnodes)) return -1;
    if (id && env_int("SLURM_NODEID", id, 0, 65535, &node_rank)) return -1;
    if (!id && nnodes > 1 && !o->given_node_rank) {
        fprintf(stderr, "tprun: SLURM_NNODES is %d but SLURM_NODEID is not set: start tprun with srun "
                        "(one task per node), or give --node_rank\n", nnodes);
        return -1;
    }
    static char master[HOSTNAME_MAX];
    if (!o->master_addr) {
        if (!list || !*list) {
            fprintf(stderr, "tprun: inside SLURM job %s, but SLURM_JOB_NODELIST is not set: give --master_addr\n", job);
            return -1;
        }
        char **hosts, err[400];
        const int n = nodelist_expand(list, &hosts, err, sizeof err);
        if (n < 0) {
            fprintf(stderr, "tprun: SLURM_JOB_NODELIST: %s\n", err);
            return -1;
        }
        if (n != nnodes)
            fprintf(stderr, "tprun: warning: SLURM_JOB_NODELIST names %d host%s but SLURM_NNODES is %d\n", n,
                    n == 1 ? "" : "s", nnodes);
        snprintf(master, sizeof master, "%s", hosts[0]);
        nodelist_free(hosts, n);
        o->master_addr = master;
    }
    if (!o->given_nnodes) o->nnodes = nnodes;
    if (!o->given_node_rank) o->node_rank = node_rank;
    fprintf(stderr, "tprun: SLURM job %s: node %d of %d, master %s (from %s%s%s)\n", job, o->node_rank, o->nnodes,
            o->master_addr, o->given_nnodes ? "" : "SLURM_NNODES ", o->given_node_rank ? "" : "SLURM_NODEID ",
            o->master_addr == master ? "SLURM_JOB_NODELIST" : "--master_addr");
    return 0;
}

/* 0 ok, 1 help printed, -1 error printed. */
static int parse_args(int argc, char **argv, Opts *o) {
    *o = (Opts){.master_port = -1};
    if (flags_defaults(&TPRUN_TABLE, o)) return -1;
    o->nnodes = 1;
    FlagsParsed p;
    const int rc = flags_parse(&TPRUN_TABLE, argc, argv, o, &p);
    o->given_nnodes = flags_given(&TPRUN_TABLE, &p, "nnodes");
    o->given_node_rank = flags_given(&TPRUN_TABLE, &p, "node_rank");
    const int at = rc == 0 && p.n_operands > 0 ? argc - p.n_operands : -1;  // PROGRAM ARGS... end argv
    flags_parsed_free(&p);
    if (rc == 1) flags_help(stdout, &TPRUN_TABLE, NULL);
    if (rc) return rc;
    if (at < 0) {
        fprintf(stderr, "tprun: no PROGRAM given\n");
        flags_help(stderr, &TPRUN_TABLE, NULL);
        return -1;
    }
    o->prog_argv = argv + at;
    if (resolve_nproc(o) || (!o->standalone && from_slurm(o))) return -1;
    if (o->standalone) {
        if (o->nnodes != 1) {
            fprintf(stderr, "tprun: --standalone runs one node; --nnodes %d contradicts it\n", o->nnodes);
            return -1;
        }
        o->master_port = 0;  // always a free port
        if (!o->master_addr) o->master_addr = "127.0.0.1";
    }
    if (o->node_rank >= o->nnodes) {
        fprintf(stderr, "tprun: --node_rank %d must be below --nnodes %d\n", o->node_rank, o->nnodes);
        return -1;
    }
    if ((long)o->nnodes * o->nproc > INT_MAX / 2) {
        fprintf(stderr, "tprun: the world of %d x %d ranks is too large\n", o->nnodes, o->nproc);
        return -1;
    }
    if (o->nnodes > 1) {
        if (o->max_restarts > 0) {
            fprintf(stderr, "tprun: --max_restarts needs a single node (--nnodes 1)\n");
            return -1;
        }
        if (o->master_port == 0) {
            fprintf(stderr, "tprun: --nnodes %d needs a fixed --master_port that every node knows\n", o->nnodes);
            return -1;
        }
        if (o->master_port < 0) o->master_port = 29500;  // torchrun's default
    }
    if (!o->master_addr) o->master_addr = "127.0.0.1";
    return 0;
}

/* ---- small helpers -------------------------------------------------------- */

static int random_hex(char *out, size_t n_hex) {
    unsigned char buf[64];
    size_t n_bytes = (n_hex + 1) / 2;
    if (n_bytes > sizeof buf) return -1;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t got = 0;
    while (got < n_bytes) {
        ssize_t r = read(fd, buf + got, n_bytes - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            close(fd);
            return -1;
        }
        got += (size_t)r;
    }
    close(fd);
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n_hex; i++) out[i] = hex[(buf[i / 2] >> (i % 2 ? 0 : 4)) & 15];
    out[n_hex] = 0;
    return 0;
}

/* Finds PROGRAM: a path with '/' as is; else next to this executable, then
 * along PATH. malloc'ed path, or NULL with a message printed. */
static char *resolve_program(const char *prog) {
    if (!prog[0]) {
        fprintf(stderr, "tprun: the PROGRAM name is empty\n");
        return NULL;
    }
    if (strchr(prog, '/')) {
        if (access(prog, X_OK) != 0) {
            fprintf(stderr, "tprun: cannot run %s: %s\n", prog, strerror(errno));
            return NULL;
        }
        return strdup(prog);
    }
    char path[PATH_MAX + 1];
    struct stat st;
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    char *self_dir = NULL;
    if (n > 0) {
        self[n] = 0;
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = 0;
            self_dir = self;
            snprintf(path, sizeof path, "%s/%s", self_dir[0] ? self_dir : "/", prog);
            if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0) return strdup(path);
        }
    }
    const char *env_path = getenv("PATH");
    if (!env_path) env_path = "/usr/local/bin:/usr/bin:/bin";
    const char *p = env_path;
    for (;;) {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : strlen(p);
        if (len == 0)
            snprintf(path, sizeof path, "%s", prog);  // an empty element is the current directory
        else
            snprintf(path, sizeof path, "%.*s/%s", (int)len, p, prog);
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0) return strdup(path);
        if (!colon) break;
        p = colon + 1;
    }
    fprintf(stderr, "tprun: cannot find program '%s' next to tprun (%s) or in PATH\n", prog,
            self_dir ? self_dir : "?");
    return NULL;
}

/* ---- main ------------------------------------------------------------------- */

/* The job token: TPRUN_TOKEN with several nodes, else a random one. 0 or 1 (printed). */
static int agent_token(Agent *a) {
    const Opts *o = &a->o;
    if (o->nnodes > 1) {
        const char *tok = getenv("TPRUN_TOKEN");
        if (!tok || !tok[0] || strlen(tok) >= sizeof a->token) {
            fprintf(stderr,
                    "tprun: --nnodes %d needs the same job token on every node: set TPRUN_TOKEN (1 to %zu "
                    "characters, e.g. from 'head -c16 /dev/urandom | od -An -tx1 | tr -d \" \\n\"')\n",
                    o->nnodes, sizeof a->token - 1);
            return 1;
        }
        snprintf(a->token, sizeof a->token, "%s", tok);
    } else if (random_hex(a->token, 32) != 0) {
        fprintf(stderr, "tprun: cannot read /dev/urandom: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}

/* Everything before the store: signals' pipe, host, PROGRAM, --log_dir,
 * the job id and token. 0, or the exit status (printed). */
static int agent_setup(Agent *a) {
    const Opts *o = &a->o;
    // The handlers come after the node rendezvous: until then the default
    // dispositions let Ctrl-C end a tprun that has no workers yet.
    if (pipe2(g_sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        fprintf(stderr, "tprun: cannot create a pipe: %s\n", strerror(errno));
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    if (gethostname(a->host, sizeof a->host - 1) != 0) snprintf(a->host, sizeof a->host, "localhost");
    a->program = resolve_program(o->prog_argv[0]);
    if (!a->program) return 1;
    if (o->nproc > 1 && !getenv("OMP_NUM_THREADS"))
        fprintf(stderr, "tprun: OMP_NUM_THREADS is not set; each of the %d workers gets %ld thread(s) "
                        "(cores / nproc_per_node)\n", o->nproc, tp_threads_per_worker(o->nproc));
    /* Shared memory of jobs killed while their groups formed (a SIGKILLed
     * tprun takes its ranks along): removed by their recorded owner pid. */
    size_t stale_bytes = 0;
    int n_stale = shm_reclaim_stale(NULL, &stale_bytes);
    if (n_stale > 0)
        fprintf(stderr, "tprun: removed %d shared-memory segment%s (%.1f MiB) left in /dev/shm by jobs that died\n",
                n_stale, n_stale == 1 ? "" : "s", (double)stale_bytes / (1024.0 * 1024.0));
    if (o->log_dir && mkdir(o->log_dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "tprun: cannot create --log_dir %s: %s\n", o->log_dir, strerror(errno));
        return 1;
    }
    a->dev_null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (a->dev_null < 0 || random_hex(a->job_base, 16) != 0) {
        fprintf(stderr, "tprun: cannot open /dev/null or /dev/urandom: %s\n", strerror(errno));
        return 1;
    }
    return agent_token(a);
}

/* The attempts: the first, then one per restart while a worker fails. */
static void run_attempts(Agent *a, Outcome *out) {
    const Opts *o = &a->o;
    a->w = TP_CALLOC((size_t)o->nproc, sizeof *a->w);
    for (int restart = 0;; restart++) {
        run_attempt(a, restart, out);
        if (out->kind == OUT_FAILED && !out->sig && restart < o->max_restarts) {
            fprintf(stderr, "tprun: %s; restarting all workers (restart %d of %d)\n", out->report, restart + 1,
                    o->max_restarts);
            continue;
        }
        break;
    }
}

/* The outcome said, and tprun's exit status from it; *sig: the signal
 * that counts (none when the workers saved on it). */
static int outcome_code(const Agent *a, const Outcome *out, int *sig) {
    if (out->kind == OUT_FAILED) fprintf(stderr, "tprun: %s\n", out->report);
    if (out->kind == OUT_REMOTE) fprintf(stderr, "tprun: node %d stopped its workers: %s\n", a->o.node_rank, out->report);
    /* Every worker done without failure and some saved on a signal (sent to
     * tprun or to a rank): the job's status is theirs. */
    const int saved = out->kind == OUT_OK && out->saved_on_signal;
    if (out->sig && saved)
        fprintf(stderr, "tprun: received %s; the workers saved a checkpoint and stopped (exit status %d)\n",
                signal_name(out->sig), TP_EXIT_SAVED_ON_SIGNAL);
    else if (out->sig) fprintf(stderr, "tprun: received %s; stopped all workers\n", signal_name(out->sig));
    *sig = saved ? 0 : out->sig;
    /* the failed rank's own exit status, as torchrun passes it on (a death by
     * signal as the shell writes it, 128 + the signal) */
    int failed_code = WIFEXITED(out->status) ? WEXITSTATUS(out->status)
                      : WIFSIGNALED(out->status) ? 128 + WTERMSIG(out->status) : 1;
    return saved ? TP_EXIT_SAVED_ON_SIGNAL
           : *sig ? 128 + *sig
           : out->kind == OUT_OK ? 0
           : out->kind == OUT_FAILED && failed_code ? failed_code : 1;
}

static void agent_free(Agent *a) {
    store_close(a->store);
    store_server_stop(a->server);
    free(a->w);
    nodes_free(a);
    free(a->seen);
    free(a->program);
    if (a->dev_null >= 0) close(a->dev_null);
}

int main(int argc, char **argv) {
    Agent a;
    memset(&a, 0, sizeof a);
    a.dev_null = -1;
    int prc = parse_args(argc, argv, &a.o);
    if (prc) return prc > 0 ? 0 : 2;
    const Opts *o = &a.o;
    int code = agent_setup(&a);
    if (code) return code;
    char err[512];
    a.port = o->master_port;
    if (o->node_rank == 0) {
        a.server = store_server_start(o->master_addr, o->master_port > 0 ? o->master_port : 0, a.token, &a.port, err,
                                      sizeof err);
        if (!a.server) {
            fprintf(stderr, "tprun: %s\n", err);
            return 1;
        }
    }
    if (o->nnodes > 1 && join_nodes(&a) != 0) {
        code = 1;
    } else if (install_signals() != 0) {
        fprintf(stderr, "tprun: cannot install signal handlers: %s\n", strerror(errno));
        code = 1;
    } else {
        Outcome out;
        run_attempts(&a, &out);
        int sig;
        code = outcome_code(&a, &out, &sig);
        if (a.store) code = finish_nodes(&a, &out, sig, code);
    }
    agent_free(&a);
    return code;
}
