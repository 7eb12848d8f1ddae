/* warp_emu.h: an emulated CUDA thread block on the CPU, so kernel code
 * written once for the device and the host (kernels/cuda/flash_core.h,
 * layernorm_row.cuh, colsum.cuh) runs as written where no GPU is, and a
 * wrong index, mask, barrier or shared-memory offset shows as it would on
 * a GPU. Shared by test_attn_short.cc and test_ln_rows.cc, each of which
 * defines its kernel header's primitives over this.
 *
 * A block of n threads (a multiple of the warp) is n fibers (ucontext)
 * on the calling thread, resumed in turn; a 2-D block is flattened to its
 * linear index (x fastest, as CUDA numbers the warps' lanes).
 * __syncthreads is a barrier over the block's threads; a warp shuffle is
 * a barrier over the warp's 32: each lane posts its words, all wait, each
 * reads its partner's, all wait again (so the next exchange cannot
 * overwrite a word before it is read). A thread waiting at a barrier
 * yields to the next; it runs on once the barrier's last thread arrives,
 * so any order of arrival the code allows is one a GPU could show for the
 * barriers' purposes. Fibers, not OS threads: a block of 1024 threads
 * costs a millisecond, not tens. Blocks of a grid run one after the other
 * (the kernels' blocks never wait on each other).
 * Shared memory is all one bits (a NaN as fp32, fp64 and bf16): whatever
 * the kernels read must have been written. Slow (a barrier is a few context switches): test shapes small. */
#ifndef TPTRAIN_WARP_EMU_H
#define TPTRAIN_WARP_EMU_H

#include <functional>
#include <memory>
#include <vector>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

namespace emu {

constexpr int WARP = 32;
constexpr int WORDS = 8;              // 32-bit words a lane can post in one exchange
constexpr size_t STACK = 256 * 1024;  // a thread's stack

/* The running block: its threads are fibers (ucontext) on the calling
 * thread, resumed in turn by run_block; a barrier yields until its last
 * thread arrives. */
struct Sched {
    ucontext_t main;
    std::vector<ucontext_t> ctx;
    std::vector<std::unique_ptr<char[]>> stacks;  // kept between blocks
    std::vector<bool> done;
    std::function<void(unsigned char *)> body;
    unsigned char *smem = nullptr;
    int cur = 0;
    bool progress = false;  // a barrier released or a thread finished since the last pass
};
inline Sched g_sched;

inline void yield() { swapcontext(&g_sched.ctx[g_sched.cur], &g_sched.main); }

class Barrier {  // a reusable barrier of n threads
  public:
    explicit Barrier(int n) : n_(n) {}
    void wait() {
        const long gen = gen_;
        if (++count_ == n_) {
            count_ = 0;
            gen_++;
            g_sched.progress = true;
            return;
        }
        while (gen_ == gen) yield();
    }

  private:
    const int n_;
    int count_ = 0;
    long gen_ = 0;
};

struct Warp {
    Barrier bar{WARP};
    uint32_t words[WARP][WORDS];  // what each lane posted in the current exchange
};

struct Block {
    explicit Block(int n) : threads(n), bar(n), warps(new Warp[n / WARP]) {}
    const int threads;
    Barrier bar;
    std::unique_ptr<Warp[]> warps;
};

inline Block *g_block;

inline int tid() { return g_sched.cur; }
inline int lane() { return g_sched.cur % WARP; }
inline Warp &warp() { return g_block->warps[g_sched.cur / WARP]; }
inline void sync() { g_block->bar.wait(); }

/* The calling lane's bytes posted; after the first wait every lane's are
 * readable in warp().words, until the caller's exchange_end(). */
inline void exchange_begin(const void *mine, size_t bytes) {
    Warp &w = warp();
    memcpy(w.words[lane()], mine, bytes);
    w.bar.wait();
}
inline void exchange_end() { warp().bar.wait(); }

/* __shfl_xor_sync(0xffffffff, x, m) for a value of up to WORDS words. */
template <class T>
inline T shfl_xor(T x, int m) {
    static_assert(sizeof(T) <= sizeof(uint32_t) * WORDS, "a lane's words");
    exchange_begin(&x, sizeof x);
    T y;
    memcpy(&y, warp().words[lane() ^ m], sizeof y);
    exchange_end();
    return y;
}

inline void fiber_main() {
    g_sched.body(g_sched.smem);
    g_sched.done[g_sched.cur] = true;
    g_sched.progress = true;
}  // returns to uc_link: main

/* One block's body on `threads` emulated threads (a multiple of WARP),
 * with smem_bytes of shared memory (all one bits), 16-byte aligned. A
 * barrier some thread never reaches (a deadlock on a GPU) aborts. */
template <class Body>
inline void run_block(int threads, size_t smem_bytes, Body body) {
    Sched &s = g_sched;
    Block blk(threads);
    std::vector<unsigned char> smem(smem_bytes + 16, 0xff);
    g_block = &blk;
    s.body = body;
    s.smem = (unsigned char *)(((uintptr_t)smem.data() + 15) & ~(uintptr_t)15);
    s.ctx.resize(threads);
    s.done.assign(threads, false);
    while ((int)s.stacks.size() < threads) s.stacks.emplace_back(new char[STACK]);
    for (int i = 0; i < threads; i++) {
        getcontext(&s.ctx[i]);
        s.ctx[i].uc_stack.ss_sp = s.stacks[i].get();
        s.ctx[i].uc_stack.ss_size = STACK;
        s.ctx[i].uc_link = &s.main;
        makecontext(&s.ctx[i], fiber_main, 0);
    }
    for (int live = threads; live > 0;) {
        s.progress = false;
        live = 0;
        for (int i = 0; i < threads; i++) {
            if (s.done[i]) continue;
            s.cur = i;
            swapcontext(&s.main, &s.ctx[i]);
            live += !s.done[i];
        }
        if (live > 0 && !s.progress) {
            fprintf(stderr, "warp_emu: %d threads wait at a barrier the others never reach\n", live);
            abort();
        }
    }
    g_block = nullptr;
}

}  // namespace emu

#endif
