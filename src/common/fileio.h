/* fileio.h: the project's one whole-file reader and its atomic writers.
 *
 * Every reader of an input file (manifests, `latest`, shards, config.json,
 * the tokenizer, corpus text, token files) opens it through
 * tp_open_regular(): O_NONBLOCK at open, so a named pipe or a device in
 * place of a file cannot hang the open, then fstat, and anything but a
 * regular file is refused with one sentence naming the path. Writers go
 * through a temporary name, fsync and rename (AtomicFile), so a crash never
 * leaves a torn file under the final name.
 */
#ifndef TPTRAIN_FILEIO_H
#define TPTRAIN_FILEIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* snprintf for paths: a path that does not fit in n bytes ends the program
 * (TP_CHECK) rather than naming another file. */
void pathf(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Opens path read-only; refuses (-1 + err naming the path) anything that is
 * not a regular file: FIFO, socket, device, directory. Returns the file
 * descriptor (blocking mode restored) and its size in *n_bytes. */
int tp_open_regular(const char *path, uint64_t *n_bytes, char *err, size_t err_len);

/* Reads a whole regular file (NUL-terminated after its bytes, caller frees);
 * its size goes to *n_bytes when non-NULL. A file larger than max_bytes
 * (0: no limit) is refused. NULL + err. */
void *read_file_bytes_max(const char *path, size_t max_bytes, size_t *n_bytes, char *err, size_t err_len);
void *read_file_bytes(const char *path, size_t *n_bytes, char *err, size_t err_len);
char *read_text_file(const char *path, char *err, size_t err_len);

/* write(2) until all n_bytes are written (short writes and EINTR retried).
 * 0, or -1 with errno set (EIO when the file takes no more bytes). */
int write_all_fd(int fd, const void *buf, size_t n_bytes);

/* A file written under a temporary name beside its final one and renamed
 * into place once complete and fsynced: path.tmp, or path.tmp.<pid> when
 * several processes may write the same file at once (per_process). The
 * temporary is created O_NOFOLLOW. atomic_file_write and
 * atomic_file_commit return 0, or -1 + err naming path; on failure the
 * temporary is removed and f is finished (nothing to call after it). */
typedef struct {
    int fd;
    char *path, *tmp;
} AtomicFile;
int atomic_file_open(AtomicFile *f, const char *path, bool per_process, char *err, size_t err_len);
int atomic_file_write(AtomicFile *f, const void *data, size_t n_bytes, char *err, size_t err_len);
int atomic_file_commit(AtomicFile *f, char *err, size_t err_len);
/* Gives up: removes the temporary (nothing to do when f is already finished). */
void atomic_file_abort(AtomicFile *f);

/* Writes a file atomically (path.tmp + fsync + rename). 0 or -1 + err; on
 * failure nothing is left under either name. */
int write_file_atomic(const char *path, const void *data, size_t n_bytes, char *err, size_t err_len);

/* Copies a file, writing the copy atomically. 0 or -1 + err. */
int copy_file_atomic(const char *from, const char *to, char *err, size_t err_len);

/* Whether a file could be written at path before the work that makes it:
 * its folder exists and is writable, and path is not a folder. 0, or -1
 * with err naming the path. */
int check_writable_path(const char *path, char *err, size_t err_len);

/* fsync of a file or a folder by name: 0, or -1 with errno set. */
int fsync_path(const char *path);
/* fsync_path of the folder holding path, so that a rename into it is
 * durable; a file system that cannot sync folders (EINVAL) counts as done. */
int fsync_parent_dir(const char *path);

/* Whether two paths name one file or folder: the same text (trailing
 * slashes aside), or, where both exist, the same device and inode. */
bool paths_same(const char *a, const char *b);

#ifdef __cplusplus
}
#endif

#endif
