// graph_record.cc: the CPU backend's graphs (graph_record.h, backend.h).
//
// A capture points the backend at a copy of its table whose op entries,
// generated from ops_list.h, append a closure to the recording: the real
// entry and the call's arguments, by value. The graph is that list; a
// launch calls each closure in order. The real entries read the StepVars
// (backend_cpu.c's step_stream, step_scale) when they run, as the CUDA
// kernels read them on the device, so a replay draws the masks and scales
// of the step it replays and nothing else changes: exactly the contract a
// CUDA graph keeps, which lets the CPU tests prove the trainer's use of it.
#include <functional>
#include <vector>

extern "C" {
#include "err.h"
}
#include "graph_record.h"

namespace {

struct Recording {
    std::vector<std::function<void()>> calls;
};

struct Capture {
    BackendOps table;         // what be->ops points at while capturing
    const BackendOps *inner;  // the real table
    Recording *rec;
};

Capture *capture_of(Backend *be) { return static_cast<Capture *>(be->capture); }

#define OP(name, cls, cpu, cuda, params, args)                     \
    void rec_##name TP_OP_WITH_BE params {                          \
        Capture *c = capture_of(be);                                \
        auto real = c->inner->name;                                 \
        c->rec->calls.emplace_back([=]() { real TP_OP_ARGS_WITH_BE args; }); \
    }
#include "ops_list.h"

}  // namespace

extern "C" void cpu_capture_begin(Backend *be) {
    TP_CHECK(!be->capture, "cpu_capture_begin: a capture is already open");
    Capture *c = new Capture;
    c->inner = be->ops;
    c->table = *be->ops;
    c->rec = new Recording;
#define OP(name, cls, cpu, cuda, params, args) c->table.name = rec_##name;
#include "ops_list.h"
    be->capture = c;
    be->ops = &c->table;
}

extern "C" void *cpu_capture_end(Backend *be, char *err, size_t err_len) {
    (void)err, (void)err_len;  // a recording cannot fail
    Capture *c = capture_of(be);
    TP_CHECK(c, "cpu_capture_end: no capture is open");
    be->ops = c->inner;
    be->capture = nullptr;
    Recording *r = c->rec;
    delete c;
    return r;
}

extern "C" void cpu_graph_launch(Backend *be, void *graph) {
    (void)be;
    for (const auto &call : static_cast<Recording *>(graph)->calls) call();
}

extern "C" void cpu_graph_free(Backend *be, void *graph) {
    (void)be;
    delete static_cast<Recording *>(graph);
}
