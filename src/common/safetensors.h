/* safetensors.h: reader and writer for the safetensors layout.
 *
 * File = 8-byte little-endian header length N, N bytes of JSON header,
 * then raw little-endian tensor data. The header maps each tensor name to
 * {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the
 * data section) and may hold "__metadata__": {string: string}.
 *
 * The writer adds metadata "crc32c" (8 lowercase hex digits) over the data
 * section, so a flipped byte is caught on load; files written by others
 * (without the key) still load. Writes go to "<path>.tmp", are fsynced and
 * renamed into place: a crash never leaves a torn file under the final name.
 *
 * The reader validates everything before returning: file size, header
 * length, JSON syntax, dtypes, shapes vs byte ranges, ranges inside the data
 * section and not overlapping, and the checksum when present. Any failure is
 * one sentence in err naming the file and the field; the call returns -1.
 * Only a regular file is read (never blocking on a named pipe), and every
 * tensor's data is aligned for its dtype (copied when the file misaligns it).
 */
#ifndef TPTRAIN_SAFETENSORS_H
#define TPTRAIN_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { ST_F32 = 0, ST_I32, ST_I64, ST_BF16, ST_F16, ST_U8 } StDtype;

#define ST_MAX_DIMS 4

typedef struct {
    char *name;
    StDtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t n_bytes;
    const void *data;      // points into StFile.data_section, or into
                           // StFile.aligned_copy when the file put it at an
                           // address not aligned for its dtype
} StTensor;

typedef struct {
    StTensor *tensors;     // in file order (sorted by data offset)
    int n_tensors;
    char **meta_keys, **meta_values;  // __metadata__ entries
    int n_meta;
    void *buffer;          // whole file contents (owned)
    size_t file_bytes;
    const uint8_t *data_section;
    size_t data_bytes;
    void *aligned_copy;    // owned: tensors copied to aligned addresses, or NULL
} StFile;

int st_read(const char *path, StFile *f, char *err, size_t err_len);
void st_free(StFile *f);
const StTensor *st_find(const StFile *f, const char *name);
const char *st_meta(const StFile *f, const char *key);  // NULL when absent
size_t st_dtype_size(StDtype d);
const char *st_dtype_name(StDtype d);

typedef struct StWriter StWriter;
StWriter *st_writer_new(void);
/* Copies nothing: data must stay valid until st_writer_write returns. */
void st_writer_add(StWriter *w, const char *name, StDtype dtype, int ndim,
                   const int64_t *shape, const void *data);
void st_writer_meta(StWriter *w, const char *key, const char *value);
/* Writes atomically (tmp + fsync + rename + fsync dir). 0 or -1 + err. */
int st_writer_write(StWriter *w, const char *path, char *err, size_t err_len);
void st_writer_free(StWriter *w);

/* CRC-32C (Castagnoli), incremental: crc = crc32c(crc, buf, n), start 0. */
uint32_t crc32c(uint32_t crc, const void *buf, size_t n_bytes);
/* The same checksum by the portable tables, whatever the processor offers,
 * and whether crc32c uses the processor's instruction (tests compare both). */
uint32_t crc32c_portable(uint32_t crc, const void *buf, size_t n_bytes);
bool crc32c_hardware(void);

#endif
