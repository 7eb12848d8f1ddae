/* corpus.h: from corpus folders of parallel text to cached token files.
 *
 * A corpus folder holds train.en/train.ja, dev.en/dev.ja, test.en/test.ja
 * (one sentence per line, UTF-8). corpus_prepare() streams the text (memory
 * does not grow with the corpus, beyond 12 bytes a pair while encoding):
 *   1. validates each split pair of files: line counts must agree (error
 *      naming both files and counts); CRLF is stripped; empty lines and
 *      lines that are not valid UTF-8 make the pair skipped and counted, or,
 *      with strict, an error naming file:line;
 *   2. trains a joint en+ja SentencePiece unigram model when
 *      cache_dir/spm.model does not exist, on a uniform seeded sample of
 *      spm_sample sentences of the kept training pairs (all of them, in
 *      file order, en before ja, when there are no more), so the same
 *      corpus always gives the same model bytes;
 *   3. encodes every split once into cache_dir/<stem>.tok (data/tokfile.h),
 *      on `workers` threads each taking a contiguous range of lines (the
 *      bytes do not depend on their number), rebuilt only when the source
 *      text, the tokenizer or the format changes (a key of their checksums
 *      is stored in the file);
 *   4. keeps beside each token file <stem>.source.json: the key, what the
 *      split's text measured (CorpusStats, the text form counts textnorm
 *      decides from) and each source file's identity (device, inode, size,
 *      modification and change times). A later start whose files still have
 *      that identity trusts the recorded key and does not read the text; a
 *      file touched, replaced or modified is read again, and only changed
 *      content rebuilds. An identity taken within a second of the file's
 *      last change is recorded untrusted (the file system's clock may not
 *      see a second change in the same tick), so the next start reads it.
 *      The record carries the CRC-32C of its own bytes and is trusted only
 *      when that, its keys (none twice) and its values (in range, agreeing
 *      with each other and with the token file's header) check out; with
 *      strict, only when it says the text passed strict's checks. Else the
 *      text is read again (with one line saying why, when verbose);
 *   5. first removes from cache_dir the temporaries (spm_train.<pid>.txt,
 *      <stem>.tok.part<i>.<pid>.{en,ja}, <name>.tmp.<pid>) of preparations
 *      whose process is gone (common/proc.h).
 * Over-long pairs (--max-len) are filtered when batches are built
 * (dataset.h), so one cache serves every max length.
 */
#ifndef TPTRAIN_CORPUS_H
#define TPTRAIN_CORPUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/textnorm.h"
#include "data/tokfile.h"

typedef struct {
    long lines;        // pairs read
    long kept;         // pairs written
    long empty;        // pairs skipped: a side is empty (after CRLF strip)
    long bad_utf8;     // pairs skipped: a side is not valid UTF-8
    long crlf;         // lines that ended in CRLF (stripped, kept)
    bool not_read;     // this call found the text unchanged by its record and did not read it
} CorpusStats;

#define CORPUS_DEFAULT_VOCAB 8000
#define CORPUS_DEFAULT_SPM_SAMPLE 2000000L

typedef struct {
    const char *data_dir;   // corpus folder (read only; corpus_prepare's)
    const char *cache_dir;  // created if missing: spm.model, <stem>.tok, <stem>.source.json
    int vocab_size;         // SentencePiece pieces (<= 0: CORPUS_DEFAULT_VOCAB)
    long spm_sample;        // sentences the tokenizer trains on (<= 0: CORPUS_DEFAULT_SPM_SAMPLE)
    int workers;            // encoding threads (<= 0: one per online core)
    bool strict;            // bad lines are errors instead of skipped
    bool verbose;           // print what is built / reused and the counts (progress on a terminal)
} CorpusConfig;

/* Prepares the splits named in splits[] (e.g. "train", "dev", "test") of
 * cfg->data_dir, each into <split>.tok; the tokenizer is trained on
 * "train". stats[i] receives the counts of splits[i] (NULL allowed). 0, or
 * -1 with one sentence in err. */
int corpus_prepare(const CorpusConfig *cfg, const char *const *splits, int n_splits, CorpusStats *stats,
                   char *err, size_t err_len);

/* One split of one corpus folder, for a cache over several corpora. */
typedef struct {
    const char *data_dir;  // the corpus folder
    const char *split;     // "train", "dev", ...: its files are <split>.en / <split>.ja
    const char *stem;      // the token file's name without ".tok" ("train", "train.c1", "dev")
    bool tokenizer;        // its text is part of the tokenizer's training sample
} CorpusPart;

/* corpus_prepare for any parts: the tokenizer is trained on the union of
 * the tokenizer parts (at least one when spm.model is missing). cfg's
 * data_dir is not used. */
int corpus_prepare_parts(const CorpusConfig *cfg, const CorpusPart *parts, int n_parts, CorpusStats *stats,
                         char *err, size_t err_len);

/* What corpus_prepare recorded of a prepared split (<stem>.source.json):
 * its counts and each side's text form counts. 0, or -1 + err naming the
 * file (missing or damaged: prepare again). */
typedef struct {
    CorpusStats stats;
    TextFormCount form_en, form_ja;
    uint32_t key;
} CorpusSplitInfo;
int corpus_split_info(const char *cache_dir, const char *stem, CorpusSplitInfo *out, char *err, size_t err_len);

/* The tokenizer cache holds one tokenizer per configuration: under a cache
 * root (cache/<corpus folder name> by default) each configuration has its
 * own folder, named by everything that changes the tokenizer, that holds
 * its spm.model and the token files made with it (corpus_prepare's
 * cache_dir): cache_root/spm-unigram-v<vocab_size>-s<spm_sample> (the model
 * type, the identity normalization and the other training options are
 * fixed in spm.cc; byte fallback follows the size; <= 0 means the
 * defaults). Writes that folder's path to out. 0, or -1 + err when it does
 * not fit. */
int corpus_cache_dir(const char *cache_root, int vocab_size, long spm_sample, char *out, size_t out_len, char *err,
                     size_t err_len);

/* The layout before it, one tokenizer straight in the cache root: a
 * cache_root/spm.model of vocab_size pieces (with its .vocab and token
 * files) is moved into its configuration's folder when that has none yet
 * (the same bytes, so checkpoints trained with it still match); one of
 * another size is left where it is, unused, and said so when verbose.
 * Returns 1 moved, 0 nothing to move, -1 + err. One process at a time
 * (train_mt's rank 0). */
int corpus_adopt_old_layout(const char *cache_root, int vocab_size, bool verbose, char *err, size_t err_len);

#endif
