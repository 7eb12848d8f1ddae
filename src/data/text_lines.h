/* text_lines.h: a text file read line by line through one buffer, so a
 * corpus of any size is validated, sampled and encoded in memory that does
 * not grow with it (data/corpus.c).
 *
 * A line ends at '\n'; the last line may lack it; a '\r' ending a line is
 * stripped and counted. Lines are handed out NUL-terminated inside the
 * buffer, valid until the next call. A reader may start at any byte offset
 * that begins a line (line_reader_tell of an earlier reader), which is how
 * encoding workers each take their own range. While it reads from the start,
 * the reader also computes the file's content checksum, crc32c(size as
 * uint64, bytes) (the corpus cache key's part), and notices a file that
 * changes size while it is read.
 *
 * Also here: the strict UTF-8 check the corpus applies to every line.
 */
#ifndef TPTRAIN_TEXT_LINES_H
#define TPTRAIN_TEXT_LINES_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    char path[PATH_MAX];
    int fd;
    char *buf;            // (cap + 1): the +1 holds the NUL of a final line without '\n'
    size_t cap, beg, end; // unread bytes are buf[beg..end)
    uint64_t buf_at;      // file offset of buf[0]
    bool eof;
    uint64_t size;        // the file's size when opened
    bool hashing;         // started at offset 0: crc covers every byte read
    uint32_t crc;         // running crc32c(size, bytes so far)
    uint64_t n_read;      // bytes read so far
    long n_crlf;          // lines that ended in "\r\n" (or a final '\r')
} LineReader;

/* Opens path at byte offset `at` (0: the start, checksummed). 0, or -1 +
 * err naming the file. */
int line_reader_open(LineReader *r, const char *path, uint64_t at, char *err, size_t err_len);
/* 1 with the next line in *line / *len, 0 at the end, -1 + err (a read
 * error, or the file changed size while it was read). */
int line_reader_next(LineReader *r, char **line, size_t *len, char *err, size_t err_len);
/* The byte offset of the next line. */
uint64_t line_reader_tell(const LineReader *r);
/* After line_reader_next returned 0 on a reader opened at 0: the content
 * checksum. */
uint32_t line_reader_crc(const LineReader *r);
void line_reader_close(LineReader *r);

/* Strict UTF-8 (Unicode Table 3-7): NULL when s[0..n) is valid, else the
 * reason, with *bad_at the 0-based offset of the offending sequence. NUL
 * bytes are refused too: lines travel as C strings. */
const char *utf8_invalid(const uint8_t *s, size_t n, size_t *bad_at);

#endif
