/* corpus_list.h: the corpora of one run, as --data names them:
 * "DIR[:COPIES],DIR[:COPIES]...". A run trains on the union of their
 * training splits (corpus k's pairs taken COPIES times an epoch, 1 when
 * not given: fairseq's and Marian's up-sampling of a smaller corpus); the
 * dev and test splits come from the first. The last ':' of an item starts
 * its copies (a whole number 1 to DATASET_MAX_COPIES), unless the whole
 * item names an existing folder whose name holds ':' (then the item is
 * that folder, once; "dir:with:colons:2" gives it copies). A folder named
 * twice is refused whatever the spelling: folders compare by device and
 * inode (C, C/, ./C, /abs/C and a link to C are one folder).
 */
#ifndef TPTRAIN_CORPUS_LIST_H
#define TPTRAIN_CORPUS_LIST_H

#include <stddef.h>

#include "data/dataset.h"

typedef struct {
    int n;
    char dir[DATASET_MAX_CORPORA][1024];
    int copies[DATASET_MAX_CORPORA];
} CorpusList;

/* 0, or -1 + err naming the item (empty, copies that are not a whole
 * number 1..DATASET_MAX_COPIES, too many corpora, a folder named twice). */
int corpus_list_parse(const char *spec, CorpusList *out, char *err, size_t err_len);

#endif
