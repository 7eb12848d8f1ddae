/* warp_emu.h: an emulated CUDA thread block on the CPU, so kernel code
 * written once for the device and the host (kernels/cuda/flash_core.h,
 * layernorm_row.cuh, colsum.cuh) runs as written where no GPU is, and a
 * wrong index, mask, barrier or shared-memory offset shows as it would on
 * a GPU. Shared by test_attn_short.cc and test_ln_rows.cc, each of which
 * defines its kernel header's primitives over this.
 *
 * A block of n threads (a multiple of the warp) is n std::threads; a 2-D
 * block is flattened to its linear index (x fastest, as CUDA numbers the
 * warps' lanes). __syncthreads is a barrier over the block's threads; a
 * warp shuffle is a barrier over the warp's 32: each lane posts its words,
 * all wait, each reads its partner's, all wait again (so the next
 * exchange cannot overwrite a word before it is read). Blocks of a grid
 * run one after the other (the kernels' blocks never wait on each other).
 * Shared memory is all one bits (a NaN as fp32, fp64 and bf16): whatever
 * the kernels read must have been written. Slow (a barrier is a few context switches): test shapes small. */
#ifndef TPTRAIN_WARP_EMU_H
#define TPTRAIN_WARP_EMU_H

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <math.h>
#include <stdint.h>
#include <string.h>

namespace emu {

constexpr int WARP = 32;
constexpr int WORDS = 8;  // 32-bit words a lane can post in one exchange

class Barrier {  // a reusable barrier of n threads
  public:
    explicit Barrier(int n) : n_(n) {}
    void wait() {
        std::unique_lock<std::mutex> lk(m_);
        const long gen = gen_;
        if (++count_ == n_) {
            count_ = 0;
            gen_++;
            cv_.notify_all();
            return;
        }
        cv_.wait(lk, [&] { return gen_ != gen; });
    }

  private:
    std::mutex m_;
    std::condition_variable cv_;
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

inline thread_local int t_id;
inline thread_local Block *t_block;

inline int tid() { return t_id; }
inline int lane() { return t_id % WARP; }
inline Warp &warp() { return t_block->warps[t_id / WARP]; }
inline void sync() { t_block->bar.wait(); }

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

/* One block's body on `threads` host threads (a multiple of WARP), with
 * smem_bytes of shared memory (all one bits), 16-byte aligned. */
template <class Body>
inline void run_block(int threads, size_t smem_bytes, Body body) {
    Block blk(threads);
    std::vector<unsigned char> smem(smem_bytes + 16, 0xff);
    unsigned char *base = (unsigned char *)(((uintptr_t)smem.data() + 15) & ~(uintptr_t)15);
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (int i = 0; i < threads; i++)
        pool.emplace_back([&, i] {
            t_id = i;
            t_block = &blk;
            body(base);
        });
    for (auto &th : pool) th.join();
}

}  // namespace emu

#endif
