/* ckpt_dir.c: the checkpoint folder: step_N names and their listing, the
 * best checkpoint (best.json and the best link), and resolving what a
 * resume names (checkpoint.h's ckpt_best_*, ckpt_list_complete,
 * ckpt_resolve).
 *
 * Calls: ckpt_save.c's step_name (ckpt_internal.h), common/.
 */
#include "json_keys.h"
#include "train/checkpoint.h"
#include "train/ckpt_internal.h"
#include "train/ckpt_pieces.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"
#include "fileio.h"
#include "safetensors.h"

/* ---- step directories ---------------------------------------------------------- */

/* The step of a "step_N" entry name (N: 1 to 18 digits, nothing after);
 * -1 for any other name. */
static int64_t parse_step_name(const char *name) {
    if (strncmp(name, "step_", 5) != 0) return -1;
    const char *d = name + 5;
    size_t n = strspn(d, "0123456789");
    if (n == 0 || n > 18 || d[n] != '\0') return -1;
    return strtoll(d, NULL, 10);
}

/* Step directories in dir, newest first (caller frees). */
int list_steps(const char *dir, int64_t **steps_out) {
    DIR *d = opendir(dir);
    *steps_out = NULL;
    if (!d) return 0;
    int n = 0, cap = 0;
    int64_t *steps = NULL;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t s = parse_step_name(e->d_name);
        if (s < 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            steps = realloc(steps, (size_t)cap * sizeof *steps);
            TP_CHECK(steps, "out of memory listing %s", dir);
        }
        steps[n++] = s;
    }
    closedir(d);
    for (int i = 1; i < n; i++)  // newest first
        for (int j = i; j > 0 && steps[j] > steps[j - 1]; j--) {
            int64_t t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    *steps_out = steps;
    return n;
}

bool is_checkpoint(const char *dir) {
    char path[4096];
    pathf(path, sizeof path, "%s/manifest.json", dir);
    return access(path, F_OK) == 0;
}

/* The newest complete checkpoint's step in dir, or -1. */
int64_t newest_complete(const char *dir) {
    int64_t *steps;
    int n = list_steps(dir, &steps);
    int64_t found = -1;
    for (int i = 0; i < n && found < 0; i++) {
        char name[64], path[4096];
        step_name(name, sizeof name, steps[i]);
        pathf(path, sizeof path, "%s/%s", dir, name);
        if (is_checkpoint(path)) found = steps[i];
    }
    free(steps);
    return found;
}

/* 0 when final is no complete checkpoint, or one whose manifest.json has
 * exactly the bytes of the new one in tmp (the same step saved again with
 * the same contents, e.g. by a resumed run that continues bit for bit);
 * else -1: replacing it would lose a checkpoint. */
int same_or_absent(const char *final, const char *tmp, int64_t step, char *err, size_t err_len) {
    if (!is_checkpoint(final)) return 0;
    char a[4096], b[4096], why[512];
    pathf(a, sizeof a, "%s/manifest.json", final);
    pathf(b, sizeof b, "%s/manifest.json", tmp);
    size_t na = 0, nb = 0;
    char *saved = read_file_bytes_max(a, MANIFEST_MAX_BYTES, &na, why, sizeof why);
    char *fresh = read_file_bytes_max(b, MANIFEST_MAX_BYTES, &nb, err, err_len);
    const bool same = saved && fresh && na == nb && memcmp(saved, fresh, na) == 0;
    free(saved);
    if (same || !fresh) {
        free(fresh);
        return same ? 0 : -1;
    }
    free(fresh);
    tp_error_set(err, err_len,
                 "%s already holds a checkpoint of step %lld with other contents: refusing to replace it (save "
                 "into another folder, or remove it first)", final, (long long)step);
    return -1;
}

/* ---- the best checkpoint ------------------------------------------------------ */

/* DIR/best.json records {"step", "metric", "value"}; DIR/best is a link to
 * step_N. best.json is written first and is the record a resume trusts; the
 * link follows it (a crash between the two leaves the link on the previous
 * best, which ckpt_best_write repairs next time). Both are replaced by
 * rename, so each is always whole. */
#define BEST_JSON_MAX_BYTES 4096

static int64_t best_link_step(const char *dir) {
    char path[4096], target[256];
    pathf(path, sizeof path, "%s/best", dir);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n <= 0) return -1;
    target[n] = '\0';
    return parse_step_name(target);
}

int ckpt_best_read(const char *dir, int64_t *step, char *metric, size_t metric_len, double *value, char *err,
                   size_t err_len) {
    char path[4096];
    pathf(path, sizeof path, "%s/best.json", dir);
    if (access(path, F_OK) != 0) return 0;
    size_t n = 0;
    char *text = read_file_bytes_max(path, BEST_JSON_MAX_BYTES, &n, err, err_len);
    if (!text) return -1;
    cJSON *o = cJSON_ParseWithLength(text, n);
    free(text);
    if (json_refuse_duplicate_keys(o, path, err, err_len)) {
        cJSON_Delete(o);
        return -1;
    }
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "metric");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "value");
    const bool ok = cJSON_IsNumber(s) && s->valuedouble >= 1 && s->valuedouble <= (INT_MAX - 1) &&
                    s->valuedouble == (double)(int64_t)s->valuedouble && cJSON_IsString(m) &&
                    (strcmp(m->valuestring, "bleu") == 0 || strcmp(m->valuestring, "loss") == 0) &&
                    cJSON_IsNumber(v) && isfinite(v->valuedouble);
    if (ok) {
        *step = (int64_t)s->valuedouble;
        snprintf(metric, metric_len, "%s", m->valuestring);
        *value = v->valuedouble;
    } else {
        tp_error_set(err, err_len, "%s: not a best-checkpoint record (needs an integer step >= 1, metric bleu or "
                     "loss, a finite value)", path);
    }
    cJSON_Delete(o);
    return ok ? 1 : -1;
}

/* The steps best.json and the best link name (-1 where absent). */
void best_steps(const char *dir, int64_t *recorded, int64_t *linked) {
    char metric[16], why[512];
    double v;
    if (ckpt_best_read(dir, recorded, metric, sizeof metric, &v, why, sizeof why) != 1) *recorded = -1;
    *linked = best_link_step(dir);
}

int ckpt_best_write(const char *dir, int64_t step, const char *metric, double value, char *err, size_t err_len) {
    char name[64], path[4096], link_tmp[4096], json[256];
    step_name(name, sizeof name, step);
    pathf(path, sizeof path, "%s/%s", dir, name);
    if (!is_checkpoint(path)) {
        tp_error_set(err, err_len, "%s: no complete checkpoint to keep as the best", path);
        return -1;
    }
    snprintf(json, sizeof json, "{\"step\": %lld, \"metric\": \"%s\", \"value\": %.17g}\n", (long long)step, metric,
             value);
    pathf(path, sizeof path, "%s/best.json", dir);
    if (write_file_atomic(path, json, strlen(json), err, err_len) != 0) return -1;
    pathf(link_tmp, sizeof link_tmp, "%s/best.tmp", dir);
    pathf(path, sizeof path, "%s/best", dir);
    unlink(link_tmp);
    if (symlink(name, link_tmp) != 0 || rename(link_tmp, path) != 0 || fsync_path(dir) != 0) {
        tp_error_set(err, err_len, "%s: cannot point it at %s (%s)", path, name, strerror(errno));
        return -1;
    }
    return 0;
}

int ckpt_list_complete(const char *dir, int64_t **steps_out) {
    int64_t *steps;
    int n = list_steps(dir, &steps), k = 0;
    for (int i = 0; i < n; i++) {
        char name[64], path[4096];
        step_name(name, sizeof name, steps[i]);
        pathf(path, sizeof path, "%s/%s", dir, name);
        if (is_checkpoint(path)) steps[k++] = steps[i];
    }
    *steps_out = steps;
    return k;
}


/* ---- resolve ------------------------------------------------------------------ */

/* The longest `latest` a resume reads: "step_" and up to 18 digits, a newline. */
#define LATEST_MAX_BYTES 64

int ckpt_resolve(const char *arg, char *out, size_t out_len, char *err, size_t err_len) {
    struct stat sb;
    if (stat(arg, &sb) != 0) {
        if (errno == ENOENT) return 0;
        tp_error_set(err, err_len, "%s: %s", arg, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        tp_error_set(err, err_len, "%s: not a directory", arg);
        return -1;
    }
    if (is_checkpoint(arg)) {
        snprintf(out, out_len, "%s", arg);
        return 1;
    }
    char path[4096], why[512];
    pathf(path, sizeof path, "%s/latest", arg);
    if (access(path, F_OK) == 0) {
        size_t n = 0;
        char *latest = read_file_bytes_max(path, LATEST_MAX_BYTES, &n, why, sizeof why);
        bool named = false;
        if (latest) {
            if (n > 0 && latest[n - 1] == '\n') latest[--n] = '\0';
            if (n > 0 && latest[n - 1] == '\r') latest[--n] = '\0';
            named = strlen(latest) == n && parse_step_name(latest) >= 0;
        }
        if (named) pathf(path, sizeof path, "%s/%s", arg, latest);
        if (named && is_checkpoint(path)) {
            snprintf(out, out_len, "%s", path);
            free(latest);
            return 1;
        }
        if (!latest)
            fprintf(stderr, "checkpoint: %s; looking for the newest complete checkpoint\n", why);
        else if (!named)
            fprintf(stderr, "checkpoint: %s/latest does not name a step directory; looking for the newest complete "
                            "checkpoint\n", arg);
        else
            fprintf(stderr, "checkpoint: %s/latest names an incomplete checkpoint; looking for the newest complete "
                            "one\n", arg);
        free(latest);
    }
    int64_t *steps;
    int n = list_steps(arg, &steps);
    int found = 0;
    for (int i = 0; i < n && !found; i++) {
        char name[64];
        step_name(name, sizeof name, steps[i]);
        pathf(path, sizeof path, "%s/%s", arg, name);
        if (is_checkpoint(path)) {
            snprintf(out, out_len, "%s", path);
            found = 1;
        } else {
            fprintf(stderr, "checkpoint: skipping %s: incomplete (no manifest.json)\n", path);
        }
    }
    free(steps);
    DIR *d = opendir(arg);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len > 4 && strcmp(e->d_name + len - 4, ".tmp") == 0 && strncmp(e->d_name, "step_", 5) == 0)
            fprintf(stderr, "checkpoint: ignoring %s/%s: a save that did not finish\n", arg, e->d_name);
    }
    if (d) closedir(d);
    return found;
}

int ckpt_resolve_model(const char *arg, char *out, size_t out_len, char *err, size_t err_len) {
    const int found = ckpt_resolve(arg, out, out_len, err, err_len);
    if (found <= 0) return found;
    char probe[4096];
    pathf(probe, sizeof probe, "%s/config.json", arg);
    if (access(probe, F_OK) != 0) return 1;
    tp_error_set(err, err_len,
                 "%s holds both an exported model (config.json) and checkpoints (the newest %s): refusing to guess "
                 "which is meant, and the export may be older than the checkpoints; give the checkpoint folder "
                 "itself, or move the export into a folder of its own",
                 arg, out);
    return -1;
}
