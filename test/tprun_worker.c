/* tprun_worker.c: the worker program test_tprun.sh launches under tprun.
 * One small C program rather than shell scripts, so a test controls exactly
 * how a rank behaves (exit code, death by signal, ignoring SIGTERM, a child
 * process of its own) and leaves evidence (pid files) without the shell's
 * own signal handling in the way.
 *
 *   tprun_worker free-port              print a free TCP port on 127.0.0.1
 *   tprun_worker env DIR                DIR/env_<RANK>: the launcher's variables; a few output lines
 *   tprun_worker store                  rendezvous of all ranks through the job's store
 *   tprun_worker run DIR MARKER [--fail-rank R --code C] [--kill-rank R] [--fail-once-rank R]
 *                [--exit0-rank R] [--fail-after S] [--ignore-term] [--child] [--seconds S]
 *       writes DIR/pid_<RANK>_<RESTART> (and cpid_... for --child's process), then behaves as told; sleeps S
 *       seconds (3600) and exits 0. --exit0-rank's rank exits 0 after 0.3 s; --fail-rank's rank fails after
 *       --fail-after seconds (0.3). MARKER only tags the command line for pgrep.
 *   tprun_worker die                    rank 1 ends through the project's fatal-error path (TP_CHECK)
 *   tprun_worker refuse                 every rank prints the same refusal: rank 0 first, then takes 0.6 s
 *                                       to exit 2; the others print it at 0.3 s and exit 1 at once
 *   tprun_worker shm-form DIR           rank 0 starts forming the shared-memory group "world" of the job
 *                                       (writes DIR/shm_name once its segment exists); the others never
 *                                       join: the job stays in that window until it is killed
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "err.h"
#include "tp/comm_shm.h"
#include "tp/store.h"

static int env_int(const char *name) {
    const char *v = getenv(name);
    return v ? atoi(v) : -1;
}

static void sleep_s(double s) {
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || getsockname(fd, (struct sockaddr *)&sa, &sl))
        return 1;
    printf("%d\n", ntohs(sa.sin_port));
    close(fd);
    return 0;
}

static int mode_env(const char *dir) {
    static const char *names[] = {"RANK",        "LOCAL_RANK",   "WORLD_SIZE",  "LOCAL_WORLD_SIZE",
                                  "GROUP_RANK",  "ROLE_RANK",    "NODE_RANK",   "MASTER_ADDR",
                                  "MASTER_PORT", "TPRUN_TOKEN",  "TPRUN_JOB_ID", "TORCHELASTIC_RESTART_COUNT"};
    char path[4096];
    snprintf(path, sizeof path, "%s/env_%d", dir, env_int("RANK"));
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const char *v = getenv(names[i]);
        fprintf(f, "%s=%s\n", names[i], v ? v : "<unset>");
    }
    fclose(f);
    int rank = env_int("RANK");
    printf("out line from %d\n", rank);
    fprintf(stderr, "err line from %d\n", rank);
    printf("tail-%d", rank);  // no newline: tprun must still print it
    return 0;
}

static int mode_store(void) {
    const char *addr = getenv("MASTER_ADDR"), *token = getenv("TPRUN_TOKEN");
    int port = env_int("MASTER_PORT"), rank = env_int("RANK"), world = env_int("WORLD_SIZE");
    const char *job = getenv("TPRUN_JOB_ID");
    if (!addr || !token || !job || port <= 0 || rank < 0 || world < 1) {
        fprintf(stderr, "launcher environment incomplete\n");
        return 1;
    }
    char err[512];
    StoreClient *bad = store_connect(addr, port, "not-the-token", 5.0, err, sizeof err);
    if (bad) {
        fprintf(stderr, "a wrong token was accepted\n");
        return 1;
    }
    StoreClient *c = store_connect(addr, port, token, 10.0, err, sizeof err);
    if (!c) {
        fprintf(stderr, "connect: %s\n", err);
        return 1;
    }
    char key[128], val[64];
    snprintf(key, sizeof key, "%s/rank/%d", job, rank);
    snprintf(val, sizeof val, "hello %d", rank);
    if (store_set(c, key, val, strlen(val)) != 0) goto fail;
    snprintf(key, sizeof key, "%s/barrier", job);
    if (store_barrier(c, key, world, 20.0) != 0) goto fail;
    for (int r = 0; r < world; r++) {
        snprintf(key, sizeof key, "%s/rank/%d", job, r);
        char *v = store_check(c, key) == 1 ? store_get(c, key, NULL, 0) : NULL;
        snprintf(val, sizeof val, "hello %d", r);
        if (!v || strcmp(v, val) != 0) {
            fprintf(stderr, "rank %d: key %s missing or wrong after the barrier\n", rank, key);
            free(v);
            store_close(c);
            return 1;
        }
        free(v);
    }
    printf("store ok (world %d)\n", world);
    store_close(c);
    return 0;
fail:
    fprintf(stderr, "store: %s\n", store_error(c));
    store_close(c);
    return 1;
}

static int mode_run(int argc, char **argv) {
    if (argc < 4) return 2;
    const char *dir = argv[2];
    int fail_rank = -1, code = 1, kill_rank = -1, fail_once_rank = -1, exit0_rank = -1, ignore_term = 0, child = 0;
    double seconds = 3600, fail_after = 0.3;
    for (int i = 4; i < argc; i++) {
        if (!strcmp(argv[i], "--fail-rank") && i + 1 < argc) fail_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--code") && i + 1 < argc) code = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kill-rank") && i + 1 < argc) kill_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--fail-once-rank") && i + 1 < argc) fail_once_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--exit0-rank") && i + 1 < argc) exit0_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--fail-after") && i + 1 < argc) fail_after = atof(argv[++i]);
        else if (!strcmp(argv[i], "--ignore-term")) ignore_term = 1;
        else if (!strcmp(argv[i], "--child")) child = 1;
        else {
            fprintf(stderr, "tprun_worker: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    int rank = env_int("RANK"), restart = env_int("TORCHELASTIC_RESTART_COUNT");
    char path[4096], tmp[4200];
    if (ignore_term) signal(SIGTERM, SIG_IGN);
    if (child && fork() == 0) {  // a grandchild of tprun with the same command line (same marker)
        snprintf(path, sizeof path, "%s/cpid_%d_%d", dir, rank, restart);
        FILE *f = fopen(path, "w");
        if (f) {
            fprintf(f, "%d\n", (int)getpid());
            fclose(f);
        }
        sleep_s(3600);
        _exit(0);
    }
    snprintf(path, sizeof path, "%s/pid_%d_%d", dir, rank, restart);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return 1;
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
    rename(tmp, path);  // appears complete
    printf("rank %d running (restart %d)\n", rank, restart);
    fflush(stdout);
    if (rank == exit0_rank) {
        sleep_s(0.3);
        printf("rank %d exits 0 early on purpose\n", rank);
        return 0;
    }
    if (rank == fail_rank || (rank == fail_once_rank && restart == 0)) {
        sleep_s(rank == fail_rank ? fail_after : 0.3);
        fprintf(stderr, "rank %d exits with %d on purpose\n", rank, rank == fail_rank ? code : 1);
        return rank == fail_rank ? code : 1;
    }
    if (rank == kill_rank) {
        sleep_s(0.3);
        raise(SIGKILL);
    }
    sleep_s(seconds);
    return 0;
}

static int mode_die(void) {
    int rank = env_int("RANK");
    tp_set_log_rank(rank);  // as train_mt does with several ranks
    TP_CHECK(rank != 1, "rank %d stops on purpose", rank);
    sleep_s(3600);
    return 0;
}

static int mode_refuse(void) {
    const int rank = env_int("RANK");
    if (rank != 0) sleep_s(0.3);
    fprintf(stderr, "worker: refused, the same reason on every rank\n");
    if (rank != 0) return 1;
    sleep_s(0.6);
    return 2;
}

static int mode_shm_form(const char *dir) {
    const char *job = getenv("TPRUN_JOB_ID");
    int rank = env_int("RANK"), world = env_int("WORLD_SIZE");
    if (!job || rank < 0 || world < 2) return 2;
    if (rank != 0) {
        sleep_s(3600);
        return 0;
    }
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/shm_name", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return 1;
    fprintf(f, "tpt-%s-world\n", job);  // comm_shm's name for a plain job id and group
    fclose(f);
    rename(tmp, path);
    char err[512];
    Comm *c = comm_shm_create(job, "world", 0, world, 3600.0, err, sizeof err);  // waits for peers that never come
    fprintf(stderr, "shm-form: %s\n", c ? "the group formed" : err);
    return 1;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && !strcmp(argv[1], "free-port")) return free_port();
    if (argc >= 3 && !strcmp(argv[1], "env")) return mode_env(argv[2]);
    if (argc >= 2 && !strcmp(argv[1], "store")) return mode_store();
    if (argc >= 4 && !strcmp(argv[1], "run")) return mode_run(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "die")) return mode_die();
    if (argc >= 2 && !strcmp(argv[1], "refuse")) return mode_refuse();
    if (argc >= 3 && !strcmp(argv[1], "shm-form")) return mode_shm_form(argv[2]);
    fprintf(stderr, "usage: tprun_worker free-port | env DIR | store | run DIR MARKER [options] | die | refuse | shm-form DIR\n");
    return 2;
}
