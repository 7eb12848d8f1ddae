/* workers.c: one attempt of the job on this node: every worker's
 * environment built before the fork, spawned as its own process group,
 * its output read line by line (tee, log files, a stderr line several
 * ranks print shown once), reaped; the first failure named and reported,
 * the others stopped (SIGTERM, after --grace SIGKILL); signals to tprun
 * forwarded (run_attempt); with several nodes, the job's failure flag and
 * the agents' heartbeats polled on the way (poll_job).
 *
 * Calls: signals.c (tprun_internal.h), the store client (tp/store.h),
 * common/.
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
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clock.h"
#include "err.h"
#include "fileio.h"
#include "tp/threads.h"
#include "tp/shm_reclaim.h"
#include "tp/store.h"
#include "tprun/tprun_internal.h"

extern char **environ;

int ms_until(double deadline) {
    if (isinf(deadline)) return -1;
    double ms = ceil((deadline - tp_now_s()) * 1000.0);
    return ms <= 0 ? 0 : ms > 1e9 ? 1000000000 : (int)ms;
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

/* ---- workers -------------------------------------------------------------- */
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
        restore_inherited_signals();
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
void publish_failure(Agent *a, const char *report) {
    if (!a->store) return;
    long n = 0;
    if (store_add(a->store, "tprun/failed_count", 1, &n) == 0 && n == 1)
        store_set(a->store, "tprun/failed", report, strlen(report));
}

/* Multi-node, every STORE_POLL_S: nodes > 0 bump their heartbeat; every
 * node checks the failure flag; node 0 also watches the heartbeats. 0 when
 * the job is fine, 1 with *report when it failed somewhere (or the store or
 * an agent is gone). */
int poll_job(Agent *a, char *report, size_t n) {
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
void run_attempt(Agent *a, int restart, Outcome *out) {
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
