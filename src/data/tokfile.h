/* tokfile.h: the token file, a split's pairs encoded once, mapped by
 * every rank that trains on them.
 *
 * <stem>.tok, little-endian:
 *   char magic[8] = "TPTOK\0\0\1"; uint32 version = 2; uint32 n_pairs;
 *   uint64 n_tokens; uint32 key (crc32c of source texts + tokenizer);
 *   uint32 body crc (crc32c of every byte after the 40-byte header);
 *   uint32 reserved = 0; uint32 header crc (of the 36 bytes before it);
 *   then uint64 en_off[n_pairs + 1], uint64 ja_off[n_pairs + 1],
 *   uint32 line[n_pairs] (1-based source line of each pair), then
 *   int32 tokens[n_tokens]. English sentence i is tokens[en_off[i] ..
 *   en_off[i+1]), Japanese likewise (all English first, then all Japanese).
 *   Sentences hold pieces only (no bos/eos).
 *
 * The writer (token_file_assemble) takes the encoded sentences as pieces
 * written by several workers, each a contiguous range of pairs, and joins
 * them into that one layout, streaming: the file is the same bytes however
 * many pieces it was made of.
 */
#ifndef TPTRAIN_TOKFILE_H
#define TPTRAIN_TOKFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A memory-mapped token file. */
typedef struct {
    int n_pairs;
    const uint64_t *en_off, *ja_off;  // (n_pairs + 1)
    const uint32_t *line;             // (n_pairs)
    const int32_t *tokens;            // (n_tokens)
    uint64_t n_tokens;
    uint32_t key;                     // the header's key (source texts + tokenizer)
    void *map;
    size_t map_bytes;
} TokenFile;

/* Opens and validates (a regular file; magic, version, sizes, header and
 * body crc, offsets within range and monotone, every token id in [0,
 * vocab_size)). 0 or -1 + err naming the file. */
int token_file_open(TokenFile *tf, const char *path, int vocab_size, char *err, size_t err_len);
/* The same, trusting the body: the header, the sizes and the offsets are
 * checked, the body's checksum and token ids are not (another rank of the
 * job has just checked this very file with token_file_open). */
int token_file_open_checked(TokenFile *tf, const char *path, int vocab_size, char *err, size_t err_len);
/* The key and the pair count in a token file's header (its checksum
 * checked, not the body's). 0, or -1 + err when it has no valid header. */
int token_file_header(const char *path, uint32_t *key, uint32_t *n_pairs, char *err, size_t err_len);
void token_file_close(TokenFile *tf);


/* The pieces of one token file: n_parts workers' ranges, in order. */
typedef struct {
    int n_parts;
    char (*en_path)[4096], (*ja_path)[4096];  // (n_parts) each part's tokens, raw int32, en and ja
    long n_pairs;
    const uint32_t *en_len, *ja_len;          // (n_pairs) pieces of each pair's sides
    const uint32_t *line;                     // (n_pairs) 1-based source lines, increasing
} TokenPieces;

/* Writes path (atomically: a temporary of this process, fsynced, renamed)
 * from the pieces, with key in its header. 0, or -1 + err. */
int token_file_assemble(const char *path, uint32_t key, const TokenPieces *p, char *err, size_t err_len);

#endif
