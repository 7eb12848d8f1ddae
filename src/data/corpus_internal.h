/* corpus_internal.h: what the pieces of corpus preparation share (not for
 * callers of corpus.h). corpus_scan.c reads a split once (validation, the
 * key's checksums, the text form counts) and writes the tokenizer's
 * sample; corpus_encode.c encodes a scanned split on several threads;
 * corpus_meta.c keeps what a scan learned beside the token file;
 * corpus.c puts them in order. */
#ifndef TPTRAIN_CORPUS_INTERNAL_H
#define TPTRAIN_CORPUS_INTERNAL_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "data/corpus.h"
#include "data/spm.h"

#define CORPUS_MARK_EVERY 8192  // lines between the byte offsets a scan keeps for the workers
#define CORPUS_FORMAT 2          // of <stem>.source.json (2: sealed with its checksum, passes_strict)

/* A source file's identity: what a later start compares instead of reading it. */
typedef struct {
    uint64_t dev, ino, size;
    int64_t mtime_ns, ctime_ns;
    bool trusted;  // taken at least a second after the file's last change
} FileStamp;

typedef struct {
    char path[PATH_MAX];
    uint32_t crc;        // crc32c(size, bytes)
    FileStamp stamp;
    TextFormCount form;  // over every non-empty line
} SideScan;

typedef struct {
    const CorpusPart *part;
    SideScan en, ja;
    CorpusStats stats;
    bool scanned;             // read now (kept, en_at, ja_at valid); else from <stem>.source.json
    FileStamp tok;            // the token file's identity when it was last checked whole
    bool tok_known;           // tok holds one
    uint8_t *kept;            // (lines + 7) / 8 bits: pair i kept
    uint64_t *en_at, *ja_at;  // (n_marks) byte offset of line k * CORPUS_MARK_EVERY
    long n_marks;
} SplitScan;

/* The name messages give a part: its token file's stem ("train", "train.c1"), or its split. */
static inline const char *part_label(const CorpusPart *p) { return p->stem ? p->stem : p->split; }

/* corpus_scan.c */
/* Empties s for part and names its two files. 0, or -1 + err (too long). */
int split_start(SplitScan *s, const CorpusPart *part, char *err, size_t err_len);
/* Reads both files of the split once. 0, or -1 + err (a bad pair with
 * strict, counts that differ, an unreadable file). */
int split_scan(SplitScan *s, const CorpusPart *part, bool strict, bool verbose, char *err, size_t err_len);
void split_scan_free(SplitScan *s);
/* Writes the tokenizer's training text to path: of the kept pairs of the
 * scans (in order, each scan's en lines then its ja lines), a uniform
 * seeded sample of `sample` sentences, or all of them when there are no
 * more. *n_written receives the count. 0, or -1 + err. */
int corpus_write_sample(const SplitScan *const *scans, int n, long sample, const char *path, long *n_written,
                        char *err, size_t err_len);
/* The identity of path now; 0, or -1 when it cannot be stat'ed. */
int file_stamp(const char *path, FileStamp *out);
bool file_stamp_same(const FileStamp *a, const FileStamp *b);

/* corpus_encode.c */
/* Encodes the kept pairs of a scanned split into path on `workers`
 * threads. 0, or -1 + err. */
int corpus_encode(const SplitScan *s, const Spm *spm, uint32_t key, const char *path, int workers, bool verbose,
                  char *err, size_t err_len);

/* corpus_meta.c */
/* <stem>.source.json: the scan's key, counts, form and stamps (written
 * after its token file). split_meta_reuse reads it back into s (scanned =
 * false) and returns 1 when it verifies (its checksum, no key twice, every
 * value in range, its count and key agreeing with the token file's header),
 * its sources still have the recorded identities and, strict, it says the
 * text passed --strict's checks. Else 0, with why "" (no record, or the
 * sources changed: read again as usual) or one sentence on why the record
 * is not trusted. */
int split_meta_write(const char *cache_dir, const SplitScan *s, uint32_t key, char *err, size_t err_len);
int split_meta_reuse(const char *cache_dir, SplitScan *s, bool strict, char *why, size_t why_len);

/* corpus_leftover.c */
/* Removes from cache_dir the temporaries of preparations whose process is
 * gone (see corpus.h). Returns how many. */
int corpus_remove_leftovers(const char *cache_dir, bool verbose);

#endif
