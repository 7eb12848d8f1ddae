/* graph_record.h: the CPU backend's graph entries (backend.h's graphs), in
 * graph_record.cc: a capture swaps in a table whose op entries keep each
 * call (the entry and its arguments) instead of running it; a launch calls
 * the kept entries again, in order. Nothing is copied: the arguments are
 * the pointers and values the ops were queued with, so, as with a CUDA
 * graph, whatever must change between launches has to change in memory. */
#ifndef TPTRAIN_GRAPH_RECORD_H
#define TPTRAIN_GRAPH_RECORD_H

#include <stddef.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif
void cpu_capture_begin(Backend *be);
void *cpu_capture_end(Backend *be, char *err, size_t err_len);
void cpu_graph_launch(Backend *be, void *graph);
void cpu_graph_free(Backend *be, void *graph);
#ifdef __cplusplus
}
#endif

#endif
