/* tprun.c: the launcher, torchrun's flags and worker environment.
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
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clock.h"
#include "err.h"
#include "fileio.h"
#include "flags.h"
#include "parse.h"
#include "tp/launch_env.h"
#include "tp/threads.h"
#include "tp/shm_reclaim.h"
#include "tp/store.h"

extern char **environ;

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

/* ---- options -------------------------------------------------------------- */

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

static int ms_until(double deadline) {
    if (isinf(deadline)) return -1;
    double ms = ceil((deadline - tp_now_s()) * 1000.0);
    return ms <= 0 ? 0 : ms > 1e9 ? 1000000000 : (int)ms;
}

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

/* The id of attempt `restart`: the job's base id for attempt 0, a mix of it
 * and the attempt number after. 16 hex chars. */
static void attempt_id(const char *base, int restart, char out[17]) {
    if (restart == 0) {
        snprintf(out, 17, "%s", base);
        return;
    }
    uint64_t h = 1469598103934665603ull;  // FNV-1a over "base/restart"
    char text[64];
    snprintf(text, sizeof text, "%s/%d", base, restart);
    for (const char *p = text; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

static const char *signal_name(int sig) {
    switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSYS: return "SIGSYS";
    default: return "signal";
    }
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

/* ---- signals -------------------------------------------------------------- */

static int g_sig_pipe[2] = {-1, -1};  // written by the handler, read by the loop: process-wide by nature

/* Two bytes per signal, written at once (atomic on a pipe): the signal, and
 * 1 when a terminal sent it (the kernel's SI_KERNEL: a key typed; kill(2),
 * as timeout(1) and schedulers use, gives SI_USER). */
static void on_signal(int sig, siginfo_t *info, void *uctx) {
    (void)uctx;
    int saved = errno;
    unsigned char b[2] = {(unsigned char)sig, (unsigned char)(info && info->si_code == SI_KERNEL)};
    ssize_t w = write(g_sig_pipe[1], b, sizeof b);  // full pipe: a wake-up is already pending
    (void)w;
    errno = saved;
}

/* The signals tprun handles (the last, SIGPIPE, it ignores: a closed stdout
 * must not kill the agent); workers get the dispositions tprun inherited. */
static const int k_handled[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGPIPE};
#define N_HANDLED (sizeof k_handled / sizeof *k_handled)
static struct sigaction g_inherited[N_HANDLED];

static int install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_SIGINFO;
    for (size_t i = 0; i < N_HANDLED; i++) {
        if (k_handled[i] == SIGPIPE) {
            sa.sa_handler = SIG_IGN;
            sa.sa_flags = SA_RESTART;
        }
        if (sigaction(k_handled[i], &sa, &g_inherited[i]) != 0) return -1;
    }
    return 0;
}

/* ---- workers -------------------------------------------------------------- */

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

static void env_free(char **envp) {
    if (!envp) return;
    for (char **e = envp; *e; e++) free(*e);
    free(envp);
}

static char *env_pair(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *env_pair(const char *name, const char *fmt, ...) {
    char val[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(val, sizeof val, fmt, ap);
    va_end(ap);
    size_t n = strlen(name) + strlen(val) + 2;
    char *s = TP_MALLOC(n);
    snprintf(s, n, "%s=%s", name, val);
    return s;
}

static const char *k_our_vars[] = {"RANK",
                                   "LOCAL_RANK",
                                   "WORLD_SIZE",
                                   "LOCAL_WORLD_SIZE",
                                   "GROUP_RANK",
                                   "GROUP_WORLD_SIZE",
                                   "ROLE_RANK",
                                   "ROLE_WORLD_SIZE",
                                   "ROLE_NAME",
                                   "NODE_RANK",
                                   "MASTER_ADDR",
                                   "MASTER_PORT",
                                   "TORCHELASTIC_RESTART_COUNT",
                                   "TORCHELASTIC_MAX_RESTARTS",
                                   "TORCHELASTIC_RUN_ID",
                                   "TPRUN_TOKEN",
                                   "TPRUN_JOB_ID"};
#define N_OUR_VARS (sizeof k_our_vars / sizeof *k_our_vars)

static char **build_env(const Agent *a, const Worker *w, int restart, const char *job_id) {
    const Opts *o = &a->o;
    size_t n_env = 0;
    for (char **e = environ; *e; e++) n_env++;
    char **envp = TP_CALLOC(n_env + N_OUR_VARS + 2, sizeof *envp);
    size_t k = 0;
    for (char **e = environ; *e; e++) {
        int ours = 0;
        for (size_t v = 0; v < N_OUR_VARS && !ours; v++) {
            size_t len = strlen(k_our_vars[v]);
            ours = strncmp(*e, k_our_vars[v], len) == 0 && (*e)[len] == '=';
        }
        if (!ours) envp[k++] = strdup(*e);
    }
    int world = o->nnodes * o->nproc;
    envp[k++] = env_pair("RANK", "%d", w->rank);
    envp[k++] = env_pair("LOCAL_RANK", "%d", w->local_rank);
    envp[k++] = env_pair("WORLD_SIZE", "%d", world);
    envp[k++] = env_pair("LOCAL_WORLD_SIZE", "%d", o->nproc);
    envp[k++] = env_pair("GROUP_RANK", "%d", o->node_rank);
    envp[k++] = env_pair("GROUP_WORLD_SIZE", "%d", o->nnodes);
    envp[k++] = env_pair("ROLE_RANK", "%d", w->rank);
    envp[k++] = env_pair("ROLE_WORLD_SIZE", "%d", world);
    envp[k++] = env_pair("ROLE_NAME", "%s", "default");
    envp[k++] = env_pair("NODE_RANK", "%d", o->node_rank);
    envp[k++] = env_pair("MASTER_ADDR", "%s", o->master_addr);
    envp[k++] = env_pair("MASTER_PORT", "%d", a->port);
    envp[k++] = env_pair("TORCHELASTIC_RESTART_COUNT", "%d", restart);
    envp[k++] = env_pair("TORCHELASTIC_MAX_RESTARTS", "%d", o->max_restarts);
    envp[k++] = env_pair("TORCHELASTIC_RUN_ID", "%s", job_id);
    envp[k++] = env_pair("TPRUN_TOKEN", "%s", a->token);
    envp[k++] = env_pair("TPRUN_JOB_ID", "%s", job_id);
    /* Like torchrun: several workers on one node must not each start a
     * thread per core (OpenBLAS, OpenMP). The cores are shared out instead. */
    if (o->nproc > 1 && !getenv("OMP_NUM_THREADS"))
        envp[k++] = env_pair("OMP_NUM_THREADS", "%ld", tp_threads_per_worker(o->nproc));
    envp[k] = NULL;
    for (size_t i = 0; i < k; i++) TP_CHECK(envp[i] != NULL, "out of memory building the environment");
    return envp;
}

/* Async-signal-safe message for a failed exec in the child. */
static void child_die(const char *what, int err) {
    char num[16];
    int n = 0;
    char tmp[16];
    int e = err;
    do {
        tmp[n++] = (char)('0' + e % 10);
        e /= 10;
    } while (e && n < 15);
    for (int i = 0; i < n; i++) num[i] = tmp[n - 1 - i];
    num[n] = 0;
    write_all_fd(2, "tprun: ", 7);
    write_all_fd(2, what, strlen(what));
    write_all_fd(2, " (errno ", 8);
    write_all_fd(2, num, (size_t)n);
    write_all_fd(2, ")\n", 2);
    _exit(127);
}

/* Starts one worker. 0, or -1 with a message printed. */
static int spawn(Agent *a, Worker *w) {
    int po[2], pe[2];
    if (pipe2(po, O_CLOEXEC) != 0) {
        fprintf(stderr, "tprun: cannot create a pipe for rank %d: %s\n", w->rank, strerror(errno));
        return -1;
    }
    if (pipe2(pe, O_CLOEXEC) != 0) {
        fprintf(stderr, "tprun: cannot create a pipe for rank %d: %s\n", w->rank, strerror(errno));
        close(po[0]);
        close(po[1]);
        return -1;
    }
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &old);  // no handler may run in the child before exec
    pid_t agent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);  // tprun killed outright: its workers go too
        if (getppid() != agent) _exit(127);
        for (size_t i = 0; i < N_HANDLED; i++) {
            struct sigaction sa = g_inherited[i];
            // Inherited ignores stay (nohup's SIGHUP), except SIGCHLD: an
            // ignored SIGCHLD would change how the worker's own waits behave.
            if (sa.sa_handler != SIG_IGN || k_handled[i] == SIGCHLD) sa.sa_handler = SIG_DFL;
            sa.sa_flags &= ~SA_SIGINFO;
            sigaction(k_handled[i], &sa, NULL);
        }
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (dup2(a->dev_null, 0) < 0 || dup2(po[1], 1) < 0 || dup2(pe[1], 2) < 0) child_die("dup2 failed", errno);
        execve(a->program, a->o.prog_argv, w->envp);
        child_die("exec of the program failed", errno);
    }
    int fork_err = errno;
    if (pid > 0) setpgid(pid, pid);  // also here: no race with the first kill(-pid)
    sigprocmask(SIG_SETMASK, &old, NULL);
    close(po[1]);
    close(pe[1]);
    if (pid < 0) {
        fprintf(stderr, "tprun: cannot fork rank %d: %s\n", w->rank, strerror(fork_err));
        close(po[0]);
        close(pe[0]);
        return -1;
    }
    fcntl(po[0], F_SETFL, O_NONBLOCK);
    fcntl(pe[0], F_SETFL, O_NONBLOCK);
    w->pid = pid;
    w->running = 1;
    w->group_alive = 1;
    w->out = (Stream){.fd = po[0], .is_err = 0};
    w->err = (Stream){.fd = pe[0], .is_err = 1};
    return 0;
}

/* One complete line (or a piece of an overlong one) to its destinations. A
 * failed write (a closed terminal or pipe) loses the output; the job goes on. */
/* Whether another rank already showed this stderr line (then it is not
 * shown again: a refusal every rank prints appears once); remembers it. */
static int shown_by_other(Agent *a, int rank, const char *line, size_t n) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a, 64 bits: lines that differ do not meet in practice
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)line[i]) * 1099511628211ull;
    for (int i = 0; i < a->n_seen; i++)
        if (a->seen[i].hash == h) return a->seen[i].rank != rank;
    if (!a->seen) a->seen = TP_CALLOC(SEEN_LINES_MAX, sizeof *a->seen);
    if (a->n_seen < SEEN_LINES_MAX) {
        a->seen[a->n_seen].hash = h;
        a->seen[a->n_seen++].rank = rank;
    }
    return 0;
}

static void emit_line(Agent *a, Worker *w, const Stream *s, const char *line, size_t n) {
    const Opts *o = &a->o;
    if (s->is_err) w->last_err_seq = ++a->seq;
    if (w->log_fd >= 0) {
        write_all_fd(w->log_fd, line, n);
        write_all_fd(w->log_fd, "\n", 1);
    }
    int to_term = w->log_fd < 0 || (o->tee & (s->is_err ? 2 : 1));
    if (!to_term || (s->is_err && shown_by_other(a, w->rank, line, n))) return;
    char prefix[32];
    int pn = snprintf(prefix, sizeof prefix, "[rank %d] ", w->rank);
    size_t total = (size_t)pn + n + 1;
    char stackbuf[4096];
    char *buf = total <= sizeof stackbuf ? stackbuf : TP_MALLOC(total);
    memcpy(buf, prefix, (size_t)pn);
    memcpy(buf + pn, line, n);
    buf[total - 1] = '\n';
    write_all_fd(s->is_err ? 2 : 1, buf, total);  // one write: lines of ranks do not interleave
    if (buf != stackbuf) free(buf);
}

static void stream_close(Agent *a, Worker *w, Stream *s) {
    if (s->fd < 0) return;
    if (s->len) emit_line(a, w, s, s->buf, s->len);  // the last, unterminated line
    close(s->fd);
    s->fd = -1;
    free(s->buf);
    s->buf = NULL;
    s->len = s->cap = 0;
}

static void stream_read(Agent *a, Worker *w, Stream *s) {
    char chunk[65536];
    for (;;) {
        ssize_t r = read(s->fd, chunk, sizeof chunk);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (r <= 0) {
            stream_close(a, w, s);
            return;
        }
        if (s->len + (size_t)r > s->cap) {
            size_t cap = s->cap ? s->cap : 4096;
            while (cap < s->len + (size_t)r) cap *= 2;
            s->buf = realloc(s->buf, cap);
            TP_CHECK(s->buf != NULL, "out of memory buffering worker output");
            s->cap = cap;
        }
        memcpy(s->buf + s->len, chunk, (size_t)r);
        s->len += (size_t)r;
        size_t start = 0;
        for (size_t i = 0; i < s->len; i++) {
            if (s->buf[i] == '\n') {
                emit_line(a, w, s, s->buf + start, i - start);
                start = i + 1;
            } else if (i - start + 1 >= LINE_MAX_BYTES) {
                emit_line(a, w, s, s->buf + start, i - start + 1);
                start = i + 1;
            }
        }
        memmove(s->buf, s->buf + start, s->len - start);
        s->len -= start;
    }
}

static int group_has_members(pid_t pgid) { return kill(-pgid, 0) == 0 || errno == EPERM; }

static void signal_groups(Agent *a, int sig) {
    for (int i = 0; i < a->o.nproc; i++) {
        Worker *w = &a->w[i];
        if (w->pid > 0 && w->group_alive) {
            if (kill(-w->pid, sig) != 0 && errno == ESRCH) w->group_alive = 0;
        }
    }
}

static void describe_status(int status, char *out, size_t n) {
    if (WIFEXITED(status))
        snprintf(out, n, "exit code %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(out, n, "killed by signal %s (%d)", signal_name(WTERMSIG(status)), WTERMSIG(status));
    else
        snprintf(out, n, "wait status %#x", status);
}

/* Multi-node: publishes the first failure of the job (if nobody did yet). */
static void publish_failure(Agent *a, const char *report) {
    if (!a->store) return;
    long n = 0;
    if (store_add(a->store, "tprun/failed_count", 1, &n) == 0 && n == 1)
        store_set(a->store, "tprun/failed", report, strlen(report));
}

/* Multi-node, every STORE_POLL_S: nodes > 0 bump their heartbeat; every
 * node checks the failure flag; node 0 also watches the heartbeats. 0 when
 * the job is fine, 1 with *report when it failed somewhere (or the store or
 * an agent is gone). */
static int poll_job(Agent *a, char *report, size_t n) {
    const Opts *o = &a->o;
    char key[64];
    long v = 0;
    if (o->node_rank > 0) {
        snprintf(key, sizeof key, "tprun/hb/%d", o->node_rank);
        if (store_add(a->store, key, 1, &v) != 0) goto lost;
    }
    int f = store_check(a->store, "tprun/failed");
    if (f < 0) goto lost;
    if (f > 0) {
        char *val = store_get(a->store, "tprun/failed", NULL, 5.0);
        snprintf(report, n, "%s", val ? val : "another node failed");
        free(val);
        return 1;
    }
    if (o->node_rank == 0) {
        double t = tp_now_s();
        for (int r = 1; r < o->nnodes; r++) {
            snprintf(key, sizeof key, "tprun/hb/%d", r);
            if (store_add(a->store, key, 0, &v) != 0) goto lost;
            if (v != a->hb_seen[r] || a->hb_when[r] == 0) {
                a->hb_seen[r] = v;
                a->hb_when[r] = t;
            } else if (t - a->hb_when[r] > HEARTBEAT_TIMEOUT_S) {
                snprintf(report, n, "the tprun agent of node %d on host %s stopped responding for %.0f s", r,
                         a->node_host[r], HEARTBEAT_TIMEOUT_S);
                publish_failure(a, report);
                a->n_silent++;
                return 1;
            }
        }
    }
    return 0;
lost:
    snprintf(report, n, "lost the store at %s:%d, hosted by node 0's tprun (%s)", o->master_addr, a->port,
             store_error(a->store));
    return 1;
}

/* The failure to name among the workers reaped failed so far (all before
 * any SIGTERM of ours): the one whose error came first, i.e. whose last
 * stderr line came earliest (or, having written none, whose exit did). A
 * rank that printed the cause and then took its time to exit is named
 * rather than a peer that died of its absence a moment sooner. */
static void report_failure(Agent *a, const Worker *early, Outcome *out) {
    const Worker *f = NULL;
    unsigned long f_key = 0;
    for (int i = 0; i < a->o.nproc; i++) {
        const Worker *w = &a->w[i];
        if (w->running || !w->reaped_seq || (WIFEXITED(w->status) && WEXITSTATUS(w->status) == 0)) continue;
        const unsigned long key = w->last_err_seq ? w->last_err_seq : w->reaped_seq;
        if (!f || key < f_key) f = w, f_key = key;
    }
    TP_CHECK(f != NULL, "tprun: a failure to report but no failed worker");
    char what[96];
    describe_status(f->status, what, sizeof what);
    /* A rank that returned 0 while its peers still ran usually is what
     * ended the job: they fail on the missing peer. */
    if (early)
        snprintf(out->report, sizeof out->report,
                 "rank %d (local rank %d, pid %d) on host %s exited 0 early, while other ranks were still running, "
                 "and the job failed after it: rank %d (local rank %d, pid %d) %s",
                 early->rank, early->local_rank, (int)early->pid, a->host, f->rank, f->local_rank, (int)f->pid, what);
    else
        snprintf(out->report, sizeof out->report, "rank %d (local rank %d, pid %d) on host %s failed first: %s",
                 f->rank, f->local_rank, (int)f->pid, a->host, what);
    out->kind = OUT_FAILED;
    out->status = f->status;
    publish_failure(a, out->report);
}

/* Where one attempt stands: the loop's state between rounds of poll(). */
typedef struct {
    int stopping, killed;  // SIGTERM sent to all / SIGKILL sent to all
    double kill_deadline, drain_deadline, next_store_poll;
    int have_failure, reported;
    double settle_deadline;  // the first failure's FAILURE_SETTLE_S window
    const Worker *early;     // the first worker to exit 0 while others still ran
    struct pollfd *pfds;     // the signal pipe, then every open stream
    Stream **pstreams;
    Worker **pworkers;
} Attempt;

/* SIGTERM to every worker group, SIGKILL after --grace seconds from now. */
static void stop_all(Agent *a, Attempt *t, double now) {
    t->stopping = 1;
    t->kill_deadline = now + a->o.grace;
    signal_groups(a, SIGTERM);
}

/* Every worker's rank, log file and environment, before any is started. */
static void workers_prepare(Agent *a, int restart, const char *job_id) {
    const Opts *o = &a->o;
    for (int i = 0; i < o->nproc; i++) {
        Worker *w = &a->w[i];
        memset(w, 0, sizeof *w);
        w->local_rank = i;
        w->rank = o->node_rank * o->nproc + i;
        w->out.fd = w->err.fd = w->log_fd = -1;
        if (o->log_dir) {
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/rank_%d.log", o->log_dir, w->rank);
            w->log_fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | (restart ? O_APPEND : O_TRUNC), 0644);
            if (w->log_fd < 0) fprintf(stderr, "tprun: cannot write %s: %s (output goes to the terminal)\n", path,
                                       strerror(errno));
        }
        w->envp = build_env(a, w, restart, job_id);
    }
}

/* Starts every worker; one that cannot start is the failure and stops the rest. */
static void workers_spawn(Agent *a, Attempt *t, Outcome *out) {
    for (int i = 0; i < a->o.nproc; i++) {
        if (spawn(a, &a->w[i]) != 0) {
            snprintf(out->report, sizeof out->report, "rank %d (local rank %d) on host %s could not be started",
                     a->w[i].rank, i, a->host);
            out->kind = OUT_FAILED;
            out->status = 1 << 8;  // as an exit code 1
            t->have_failure = t->reported = 1;
            publish_failure(a, out->report);
            stop_all(a, t, tp_now_s());
            break;
        }
    }
}

/* The next poll() deadline: draining, SIGKILL, the store, the settle
 * window, or a tick while a group outlives its leader. */
static double attempt_deadline(const Attempt *t, int n_orphan_groups) {
    double deadline = t->drain_deadline;
    if (t->stopping && !t->killed && t->kill_deadline < deadline) deadline = t->kill_deadline;
    if (!t->stopping && t->next_store_poll < deadline) deadline = t->next_store_poll;
    if (t->have_failure && !t->reported && t->settle_deadline < deadline) deadline = t->settle_deadline;
    if (n_orphan_groups > 0) {  // a group outlives its leader: no SIGCHLD will tell when it empties
        double tick = tp_now_s() + (t->stopping ? GROUP_TICK_S : 10 * GROUP_TICK_S);
        if (tick < deadline) deadline = tick;
    }
    return deadline;
}

/* poll() on the signal pipe and every open stream until deadline, then the
 * streams that have something read. -1 when poll failed (printed). */
static int poll_streams(Agent *a, Attempt *t, double deadline) {
    size_t np = 0;
    t->pfds[np++] = (struct pollfd){.fd = g_sig_pipe[0], .events = POLLIN};
    for (int i = 0; i < a->o.nproc; i++) {
        Stream *ss[2] = {&a->w[i].out, &a->w[i].err};
        for (int k = 0; k < 2; k++) {
            if (ss[k]->fd < 0) continue;
            t->pstreams[np] = ss[k];
            t->pworkers[np] = &a->w[i];
            t->pfds[np++] = (struct pollfd){.fd = ss[k]->fd, .events = POLLIN};
        }
    }
    int rc = poll(t->pfds, np, ms_until(deadline));
    if (rc < 0 && errno != EINTR) {
        fprintf(stderr, "tprun: poll failed: %s\n", strerror(errno));
        return -1;
    }
    for (size_t k = 1; rc > 0 && k < np; k++)
        if (t->pfds[k].revents) stream_read(a, t->pworkers[k], t->pstreams[k]);
    return 0;
}

/* A second signal means SIGKILL now only when it is a second request: it
 * comes SIGNAL_PAUSE_S or more after the first, or it is SIGINT typed at a
 * terminal (Ctrl-C pressed again). */
static bool second_request(const Outcome *out, int sig, bool from_tty, double now) {
    return now - out->sig_at >= SIGNAL_PAUSE_S || (sig == SIGINT && from_tty);
}

/* Signals to tprun: forwarded to the workers (the first), SIGKILL (a second request). */
static void handle_signals(Agent *a, Attempt *t, Outcome *out) {
    unsigned char sigs[64];  // pairs (signal, from a terminal): an even size keeps them whole
    ssize_t ns;
    while ((ns = read(g_sig_pipe[0], sigs, sizeof sigs)) > 0) {
        for (ssize_t k = 0; k + 1 < ns; k += 2) {
            const int sig = sigs[k];
            const bool from_tty = sigs[k + 1] != 0;
            const double now = tp_now_s();
            if (sig == SIGCHLD) continue;  // reaping covers every child
            if (!out->sig) {
                out->sig = sig;
                out->sig_at = now;
                char report[512];
                snprintf(report, sizeof report, "tprun on host %s (node %d) was stopped by %s", a->host,
                         a->o.node_rank, signal_name(sig));
                publish_failure(a, report);
                signal_groups(a, sig);
                if (!t->stopping) {
                    t->stopping = 1;
                    t->kill_deadline = now + a->o.grace;
                }
            } else if (t->killed) {
                continue;
            } else if (second_request(out, sig, from_tty, now)) {
                t->killed = 1;
                fprintf(stderr,
                        "tprun: %s again, %.1f s after %s: SIGKILL to every worker now; what they had not saved is "
                        "lost (a checkpoint being written stays incomplete and the previous one is the newest). To "
                        "let a save finish, signal once and give tprun --grace S long enough for a step and a save\n",
                        signal_name(sig), now - out->sig_at, signal_name(out->sig));
                signal_groups(a, SIGKILL);
            } else if (!out->repeats_told) {
                out->repeats_told = 1;
                fprintf(stderr,
                        "tprun: %s %.2f s after %s: taken as the same request (a second one %.0f s or more after "
                        "the first, or a second Ctrl-C, stops the workers at once)\n",
                        signal_name(sig), now - out->sig_at, signal_name(out->sig), SIGNAL_PAUSE_S);
            }
        }
    }
}

/* Reaps the workers that exited: the first failure opens the settle window,
 * a clean exit while others run is remembered as early. */
static void reap_workers(Agent *a, Attempt *t) {
    const Opts *o = &a->o;
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        Worker *w = NULL;
        for (int i = 0; i < o->nproc && !w; i++)
            if (a->w[i].pid == pid && a->w[i].running) w = &a->w[i];
        if (!w) continue;  // an orphaned grandchild handed to us as subreaper
        w->running = 0;
        w->status = status;
        if (w->out.fd >= 0) stream_read(a, w, &w->out);  // what it wrote before it exited comes first
        if (w->err.fd >= 0) stream_read(a, w, &w->err);
        w->reaped_seq = ++a->seq;
        /* "saved on signal" is no failure: the job agreed to stop and saved */
        int failed = !(WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == TP_EXIT_SAVED_ON_SIGNAL));
        if (!failed && !t->early && !t->stopping && !t->have_failure) {
            int others = 0;
            for (int i = 0; i < o->nproc; i++) others += a->w[i].running;
            if (others) t->early = w;
        }
        if (failed && !t->have_failure && !t->stopping) {
            t->have_failure = 1;  // named once the window closes (report_failure)
            t->settle_deadline = tp_now_s() + FAILURE_SETTLE_S;
        }
    }
}

/* After a round: SIGKILL once --grace has passed, and the job's failure flag
 * in the store (several nodes). */
static void escalate(Agent *a, Attempt *t, Outcome *out) {
    const Opts *o = &a->o;
    double now = tp_now_s();
    if (t->stopping && !t->killed && now >= t->kill_deadline) {
        t->killed = 1;
        int lingering = 0;
        for (int i = 0; i < o->nproc; i++) lingering += a->w[i].group_alive && a->w[i].running;
        if (lingering)
            fprintf(stderr, "tprun: %d worker%s still running %.1f s after SIGTERM: sending SIGKILL\n", lingering,
                    lingering == 1 ? "" : "s", o->grace);
        signal_groups(a, SIGKILL);
    } else if (t->killed) {
        signal_groups(a, SIGKILL);  // anything forked since the last round
    }
    if (a->store && !t->stopping && now >= t->next_store_poll) {
        t->next_store_poll = now + STORE_POLL_S;
        if (poll_job(a, out->report, sizeof out->report)) {
            out->kind = OUT_REMOTE;
            stop_all(a, t, now);
        }
    }
}

/* Streams closed, logs closed, every worker reaped; the attempt's outcome
 * and its shared memory released. */
static void attempt_finish(Agent *a, const char *job_id, Outcome *out) {
    const Opts *o = &a->o;
    for (int i = 0; i < o->nproc; i++) {
        Worker *w = &a->w[i];
        stream_close(a, w, &w->out);
        stream_close(a, w, &w->err);
        if (w->log_fd >= 0) close(w->log_fd);
        w->log_fd = -1;
        env_free(w->envp);
        w->envp = NULL;
        // Whatever is left (it escaped SIGKILL only if it left the group) is ours to reap.
        if (w->running) {
            kill(-w->pid, SIGKILL);
            while (waitpid(w->pid, &w->status, 0) < 0 && errno == EINTR) {
            }
            w->running = 0;
        }
    }
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    int n_saved = 0, n_clean = 0;
    for (int i = 0; i < o->nproc; i++) {
        const int st = a->w[i].status, code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        n_clean += code == 0 || code == TP_EXIT_SAVED_ON_SIGNAL;
        n_saved += code == TP_EXIT_SAVED_ON_SIGNAL;
    }
    out->saved_on_signal = n_clean == o->nproc && n_saved > 0;
    /* Every rank of this attempt is reaped: its shared memory is nobody's now
     * (a rank killed while its group formed leaves the segment behind). */
    shm_reclaim_job(NULL, job_id, NULL);
}

/* Runs one attempt of all local workers to the end. */
static void run_attempt(Agent *a, int restart, Outcome *out) {
    const Opts *o = &a->o;
    char job_id[17];
    attempt_id(a->job_base, restart, job_id);
    memset(out, 0, sizeof *out);
    out->kind = OUT_OK;
    workers_prepare(a, restart, job_id);
    Attempt t = {.kill_deadline = INFINITY, .drain_deadline = INFINITY, .settle_deadline = INFINITY,
                 .next_store_poll = a->store ? tp_now_s() + STORE_POLL_S : INFINITY};
    a->n_seen = 0;
    workers_spawn(a, &t, out);
    size_t cap_pfds = 1 + 2 * (size_t)o->nproc;
    t.pfds = TP_MALLOC(cap_pfds * sizeof *t.pfds);
    t.pstreams = TP_MALLOC(cap_pfds * sizeof *t.pstreams);
    t.pworkers = TP_MALLOC(cap_pfds * sizeof *t.pworkers);
    for (;;) {
        // Where are we: every worker reaped? every group empty? pipes closed?
        int n_running = 0, n_groups = 0, n_orphan_groups = 0, n_streams = 0;
        for (int i = 0; i < o->nproc; i++) {
            Worker *w = &a->w[i];
            n_running += w->running;
            if (w->group_alive && !group_has_members(w->pid)) w->group_alive = 0;
            n_groups += w->group_alive;
            n_orphan_groups += w->group_alive && !w->running;
            n_streams += (w->out.fd >= 0) + (w->err.fd >= 0);
        }
        if (t.have_failure && !t.reported && (n_running == 0 || t.stopping || tp_now_s() >= t.settle_deadline)) {
            t.reported = 1;
            report_failure(a, t.early, out);
            if (!t.stopping) stop_all(a, &t, tp_now_s());
        }
        // Every worker is done but left processes in its group: stop them.
        if (n_running == 0 && n_groups > 0 && !t.stopping) stop_all(a, &t, tp_now_s());
        if (n_running == 0 && n_groups == 0) {
            if (n_streams == 0) break;
            if (isinf(t.drain_deadline)) t.drain_deadline = tp_now_s() + DRAIN_S;
            if (tp_now_s() >= t.drain_deadline) break;  // a writer escaped the group: stop reading
        }
        if (poll_streams(a, &t, attempt_deadline(&t, n_orphan_groups))) break;
        handle_signals(a, &t, out);
        reap_workers(a, &t);
        escalate(a, &t, out);
    }
    free(t.pfds);
    free(t.pstreams);
    free(t.pworkers);
    attempt_finish(a, job_id, out);
}

/* ---- multi-node coordination ------------------------------------------------ */

/* Waits until counter `key` reaches `n`. 1 reached; 0 on timeout, on a
 * terminating signal (*sig), or (watch) when the job failed (report).
 * Heartbeats go on meanwhile. */
static int wait_counter(Agent *a, const char *key, long n, double timeout_s, int watch, int *sig, char *report,
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
static int join_nodes(Agent *a) {
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

/* Several nodes: this node's success still needs every node's success;
 * then every agent acknowledges and node 0 keeps the store up until all
 * have. Returns the exit status. */
static int finish_nodes(Agent *a, const Outcome *out, int sig, int code) {
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

static void agent_free(Agent *a) {
    store_close(a->store);
    store_server_stop(a->server);
    free(a->w);
    free(a->node_host);
    free(a->hb_seen);
    free(a->hb_when);
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
