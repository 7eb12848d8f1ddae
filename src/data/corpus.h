/* corpus.h: from a corpus folder of parallel text to cached token files.
 *
 * A corpus folder holds train.en/train.ja, dev.en/dev.ja, test.en/test.ja
 * (one sentence per line, UTF-8). corpus_prepare():
 *   1. validates each split pair of files: line counts must agree (error
 *      naming both files and counts); CRLF is stripped; empty lines and
 *      lines that are not valid UTF-8 make the pair skipped and counted, or,
 *      with strict, an error naming file:line;
 *   2. trains a joint en+ja SentencePiece unigram model on the kept training
 *      pairs when cache_dir/spm.model does not exist;
 *   3. encodes every split once into cache_dir/<split>.tok (format below),
 *      rebuilt only when the source text, the tokenizer or the format
 *      changes (a key of their checksums is stored in the file).
 *
 * Token file <split>.tok, little-endian:
 *   char magic[8] = "TPTOK\0\0\1"; uint32 version = 2; uint32 n_pairs;
 *   uint64 n_tokens; uint32 key (crc32c of source texts + tokenizer);
 *   uint32 body crc (crc32c of every byte after the 40-byte header);
 *   uint32 reserved = 0; uint32 header crc (of the 36 bytes before it);
 *   then uint64 en_off[n_pairs + 1], uint64 ja_off[n_pairs + 1],
 *   uint32 line[n_pairs] (1-based source line of each pair), then
 *   int32 tokens[n_tokens]. English sentence i is tokens[en_off[i] ..
 *   en_off[i+1]), Japanese likewise (all English first, then all Japanese).
 *   Sentences hold pieces only (no bos/eos).
 * Over-long pairs (--max-len) are filtered when batches are built
 * (dataset.h), so one cache serves every max length.
 */
#ifndef TPTRAIN_CORPUS_H
#define TPTRAIN_CORPUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    long lines;        // pairs read
    long kept;         // pairs written
    long empty;        // pairs skipped: a side is empty (after CRLF strip)
    long bad_utf8;     // pairs skipped: a side is not valid UTF-8
    long crlf;         // lines that ended in CRLF (stripped, kept)
} CorpusStats;

typedef struct {
    const char *data_dir;   // corpus folder (read only)
    const char *cache_dir;  // created if missing: spm.model, <split>.tok
    int vocab_size;         // SentencePiece pieces (default 8000)
    bool strict;            // bad lines are errors instead of skipped
    bool verbose;           // print what is built / reused and the counts
} CorpusConfig;

/* Prepares the splits named in splits[] (e.g. "train", "dev", "test"; the
 * tokenizer is always trained on "train"). stats[i] receives the counts of
 * splits[i] (NULL allowed). 0, or -1 with one sentence in err. */
int corpus_prepare(const CorpusConfig *cfg, const char *const *splits, int n_splits, CorpusStats *stats,
                   char *err, size_t err_len);

/* The tokenizer cache holds one tokenizer per configuration: under a cache
 * root (cache/<corpus folder name> by default) each configuration has its
 * own folder, named by everything that changes the tokenizer, that holds
 * its spm.model and the token files made with it (corpus_prepare's
 * cache_dir): cache_root/spm-unigram-v<vocab_size> (the model type, the
 * identity normalization and the other training options are fixed in
 * spm.cc; byte fallback follows the size). Writes that folder's path to
 * out. 0, or -1 + err when it does not fit. */
int corpus_cache_dir(const char *cache_root, int vocab_size, char *out, size_t out_len, char *err, size_t err_len);

/* The layout before it, one tokenizer straight in the cache root: a
 * cache_root/spm.model of vocab_size pieces (with its .vocab and token
 * files) is moved into its configuration's folder when that has none yet
 * (the same bytes, so checkpoints trained with it still match); one of
 * another size is left where it is, unused, and said so when verbose.
 * Returns 1 moved, 0 nothing to move, -1 + err. One process at a time
 * (train_mt's rank 0). */
int corpus_adopt_old_layout(const char *cache_root, int vocab_size, bool verbose, char *err, size_t err_len);

/* A memory-mapped token file. */
typedef struct {
    int n_pairs;
    const uint64_t *en_off, *ja_off;  // (n_pairs + 1)
    const uint32_t *line;             // (n_pairs)
    const int32_t *tokens;            // (n_tokens)
    uint64_t n_tokens;
    void *map;
    size_t map_bytes;
} TokenFile;

/* Opens and validates (a regular file; magic, version, sizes, header and
 * body crc, offsets within range and monotone, every token id in [0,
 * vocab_size)). 0 or -1 + err naming the file. */
int token_file_open(TokenFile *tf, const char *path, int vocab_size, char *err, size_t err_len);
void token_file_close(TokenFile *tf);

#endif
