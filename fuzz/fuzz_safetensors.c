/* fuzz_safetensors.c: st_read on any bytes. A file it accepts must be what
 * it promises: every tensor's bytes inside the data section, sized by its
 * dtype and shape, findable by name; every metadata key readable. A file
 * it refuses must come with a sentence. */
#include "fuzz_util.h"
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write("in.safetensors", data, size);
    StFile f;
    char err[512] = "";
    if (st_read(path, &f, err, sizeof err) != 0) {
        if (!err[0]) fuzz_fail("st_read refused without a message");
        return 0;
    }
    uint32_t crc = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const StTensor *t = &f.tensors[i];
        size_t n_elems = 1;
        for (int d = 0; d < t->ndim; d++) n_elems *= (size_t)t->shape[d];
        if (t->ndim < 0 || t->ndim > ST_MAX_DIMS) fuzz_fail("tensor %d has %d dims", i, t->ndim);
        if (n_elems * st_dtype_size(t->dtype) != t->n_bytes) fuzz_fail("tensor '%s': shape and bytes disagree", t->name);
        crc = crc32c(crc, t->data, t->n_bytes);  // ASan: every byte must be readable
        if (st_find(&f, t->name) == NULL) fuzz_fail("tensor '%s' not found by name", t->name);
        if (!st_dtype_name(t->dtype)) fuzz_fail("tensor '%s' has no dtype name", t->name);
    }
    for (int i = 0; i < f.n_meta; i++)
        if (!st_meta(&f, f.meta_keys[i]) || strlen(f.meta_values[i]) > size) fuzz_fail("metadata %d", i);
    (void)crc;
    st_free(&f);
    return 0;
}
