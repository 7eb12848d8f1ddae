/* spm.h: SentencePiece behind a small C API. spm.cc is the only C++ file in
 * the project; everything else sees this header.
 *
 * Special ids are fixed for every model this project trains:
 * pad = 0, unk = 1, bos = 2, eos = 3 (SPM_PAD_ID ...).
 */
#ifndef TPTRAIN_SPM_H
#define TPTRAIN_SPM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { SPM_PAD_ID = 0, SPM_UNK_ID = 1, SPM_BOS_ID = 2, SPM_EOS_ID = 3 };

typedef struct Spm Spm;

/* Trains a unigram model on the text files (one sentence per line) and
 * writes <model_prefix>.model and <model_prefix>.vocab. Deterministic for
 * the same inputs. 0, or -1 with a sentence in err. */
int spm_train(const char *const *input_files, int n_files, const char *model_prefix, int vocab_size,
              char *err, size_t err_len);

/* Loads a .model file; NULL with a sentence in err. */
Spm *spm_load(const char *model_path, char *err, size_t err_len);
void spm_free(Spm *s);

int spm_vocab_size(const Spm *s);

/* Encodes UTF-8 text (no trailing newline) into ids. Returns the number of
 * ids; writes at most cap of them to ids (call with cap 0 to size). -1 on
 * error. No bos/eos are added. */
int spm_encode(const Spm *s, const char *text, int32_t *ids, int cap);

/* Decodes ids (pad/bos/eos are skipped) into text; returns a malloc'ed
 * NUL-terminated string (caller frees) or NULL. */
char *spm_decode(const Spm *s, const int32_t *ids, int n);

/* Subword regularization (Kudo 2018): one segmentation of a sentence drawn
 * from the unigram model's distribution smoothed by alpha (P(x) ~ P(x)^alpha),
 * over the whole lattice (nbest < 0: forward filtering, backward sampling)
 * or over its nbest best segmentations (nbest >= 2), as SentencePiece's
 * SampleEncode does, but deterministic per call: every draw comes from
 * SplitMix64 seeded by `seed`, so the same (ids, seed) gives the same
 * sample on any thread. The sentence is given as its best ids (a token
 * file's, spm_encode's): their pieces spell the normalized text, byte
 * pieces included, so the text itself is not needed. An <unk> (no byte
 * fallback) stays where it is. Writes at most cap ids; returns the count
 * (call with cap 0 to size), or -1 on error. */
int spm_sample_ids(const Spm *s, const int32_t *best, int n_best, int nbest, float alpha, uint64_t seed,
                   int32_t *ids, int cap);

/* The piece string of an id (for debugging); "" when out of range. */
const char *spm_id_to_piece(const Spm *s, int32_t id, char *buf, size_t buf_len);

#ifdef __cplusplus
}
#endif
#endif
