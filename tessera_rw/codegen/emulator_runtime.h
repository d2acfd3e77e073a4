// The CUDA execution model on one CPU core, for running generated kernels without a GPU.
//
// A block's threads are coroutines (ucontext) run one at a time on one OS thread; blocks run one
// after another. A thread runs until it reaches __syncthreads() or a warp-collective operation
// (a shuffle, ldmatrix, mma.sync), where it yields to the scheduler:
//   - __syncthreads() releases when every live thread of the block waits at one;
//   - a warp collective releases when every live lane of its warp waits at one; each lane has
//     published its operands in the warp's exchange slots by then, and reads the others' after.
// A warp whose lanes wait at different kinds of barrier, or a block that cannot make progress, is
// reported as an error instead of hanging. Between two __syncthreads the warps run one after
// another, the last first, each as far as it can: a warp that reads shared memory another warp has
// yet to write (a missing barrier) reads stale data here.
//
// cp.async copies are deferred: the bytes land in shared memory only when cp_async_wait retires
// their group, so a kernel that reads a stage before waiting for it reads the previous tile.
//
// __shared__ variables are static locals, one copy shared by the threads of the running block;
// dynamic shared memory is one arena filled with 0xFF (NaN in every float type) before each block.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <functional>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>
#include <ucontext.h>
#include <utility>
#include <vector>

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static

struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }

dim3 threadIdx, blockIdx, blockDim, gridDim;

template <class A, class B> inline auto min(A a, B b) -> decltype(a + b) { return a < b ? a : b; }
template <class A, class B> inline auto max(A a, B b) -> decltype(a + b) { return a < b ? b : a; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
// the host rounds every float operation to nearest (SSE, no fast math): the _rn intrinsics are plain ops
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
template <class To, class From> inline To emu_bits(From f) { To t; std::memcpy(&t, &f, sizeof t); return t; }
inline float __uint_as_float(unsigned u) { return emu_bits<float>(u); }
inline float __int_as_float(int u) { return emu_bits<float>(u); }
inline unsigned __float_as_uint(float f) { return emu_bits<unsigned>(f); }
inline int __float_as_int(float f) { return emu_bits<int>(f); }
inline double __longlong_as_double(long long u) { return emu_bits<double>(u); }
inline long long __double_as_longlong(double d) { return emu_bits<long long>(d); }

namespace emu {

enum State { RUNNABLE, AT_BLOCK_BARRIER, AT_WARP_BARRIER, DONE };

struct Copy { void* dst; unsigned char bytes[16]; };

struct Thread {
    ucontext_t context;
    State state = RUNNABLE;
    dim3 index;
    unsigned collectives = 0;                 // warp collectives passed: picks the exchange buffer
    std::vector<Copy> open_group;             // cp.async copies not yet committed
    std::vector<std::vector<Copy>> groups;    // committed groups, oldest first
};

// One lane's published operands at a warp collective.
struct Slot { unsigned words[8]; const void* pointer; double value; };

struct Block {
    std::vector<Thread> threads;
    std::vector<Slot> slots;                  // [warp][2 buffers][32 lanes]
    ucontext_t scheduler;
    Thread* current = nullptr;
    const char* error = nullptr;
};

inline Block& block() { static Block b; return b; }
inline unsigned char* dynamic_smem_arena(size_t bytes = 0) {
    static std::vector<unsigned char> arena;
    if (bytes > arena.size()) arena.resize(bytes);
    return arena.data();
}

inline Thread& self() { return *block().current; }
inline int lane() { return self().index.x % 32; }     // blocks are 1-d in every generated kernel
inline int warp() { return self().index.x / 32; }

inline void yield(State state) {
    Block& b = block();
    Thread& t = *b.current;
    t.state = state;
    swapcontext(&t.context, &b.scheduler);
}

inline Slot* warp_slots(unsigned buffer) { return &block().slots[(warp() * 2 + buffer) * 32]; }

// Publish this lane's slot, wait for the warp, and return the warp's 32 slots to read from.
inline Slot* exchange(const Slot& mine) {
    Thread& t = self();
    const unsigned buffer = t.collectives++ & 1;
    Slot* slots = warp_slots(buffer);
    slots[lane()] = mine;
    yield(AT_WARP_BARRIER);
    return slots;
}

inline void apply(const std::vector<Copy>& group) {
    for (const Copy& c : group) std::memcpy(c.dst, c.bytes, 16);
}

}  // namespace emu

inline void __syncthreads() { emu::yield(emu::AT_BLOCK_BARRIER); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::exchange(emu::Slot{}); }

template <class T> inline T __shfl_xor_sync(unsigned, T v, int lane_mask, int width = 32) {
    emu::Slot mine{};
    std::memcpy(&mine.value, &v, sizeof v);
    const emu::Slot* s = emu::exchange(mine);
    const int from = emu::lane() ^ lane_mask;
    T r = v;
    if (from / width == emu::lane() / width) std::memcpy(&r, &s[from].value, sizeof r);
    return r;
}
template <class T> inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
    emu::Slot mine{};
    std::memcpy(&mine.value, &v, sizeof v);
    const emu::Slot* s = emu::exchange(mine);
    T r;
    std::memcpy(&r, &s[(emu::lane() / width) * width + src % width].value, sizeof r);
    return r;
}
template <class T> inline T __shfl_down_sync(unsigned, T v, int delta, int width = 32) {
    emu::Slot mine{};
    std::memcpy(&mine.value, &v, sizeof v);
    const emu::Slot* s = emu::exchange(mine);
    const int from = emu::lane() + delta;
    T r = v;
    if (from / width == emu::lane() / width) std::memcpy(&r, &s[from].value, sizeof r);
    return r;
}

namespace emu {

constexpr size_t STACK_BYTES = 256 * 1024;

inline std::function<void()>& kernel_body() { static std::function<void()> f; return f; }

inline void thread_entry() {
    kernel_body()();
    Block& b = block();
    b.current->state = DONE;
    swapcontext(&b.current->context, &b.scheduler);
}

inline void resume(Thread& t) {
    Block& b = block();
    b.current = &t;
    threadIdx = t.index;
    t.state = RUNNABLE;
    swapcontext(&b.scheduler, &t.context);
}

// Run one block to completion; returns an error message or nullptr.
inline const char* run_block(int threads, std::vector<char*>& stacks, size_t dynamic_smem) {
    Block& b = block();
    b.threads.assign(threads, Thread{});
    b.slots.assign(((threads + 31) / 32) * 2 * 32, Slot{});
    if (dynamic_smem) std::memset(dynamic_smem_arena(dynamic_smem), 0xFF, dynamic_smem);
    for (int i = 0; i < threads; ++i) {
        Thread& t = b.threads[i];
        t.index.x = i;
        getcontext(&t.context);
        t.context.uc_stack.ss_sp = stacks[i];
        t.context.uc_stack.ss_size = STACK_BYTES;
        t.context.uc_link = nullptr;
        makecontext(&t.context, thread_entry, 0);
    }
    // Warps run one at a time, the last first, each as far as it gets (through its warp
    // collectives) before the next starts: the order that most exposes a missing __syncthreads.
    const int warps = (threads + 31) / 32;
    while (true) {
        for (int w = warps - 1; w >= 0; --w) {
            const int first = w * 32, last = std::min(threads, first + 32);
            while (true) {
                for (int l = last - 1; l >= first; --l)
                    if (b.threads[l].state == RUNNABLE) resume(b.threads[l]);
                int live = 0, at_warp = 0, at_block = 0;
                for (int l = first; l < last; ++l) {
                    const State s = b.threads[l].state;
                    live += s != DONE;
                    at_warp += s == AT_WARP_BARRIER;
                    at_block += s == AT_BLOCK_BARRIER;
                }
                if (at_warp && at_block)
                    return "a warp's lanes wait at different barriers (a divergent __syncthreads or warp collective)";
                if (!at_warp) break;
                if (live != last - first) return "a warp collective ran after some of its warp's lanes had exited";
                for (int l = first; l < last; ++l) b.threads[l].state = RUNNABLE;
            }
        }
        bool waiting = false;
        for (Thread& t : b.threads) waiting |= t.state == AT_BLOCK_BARRIER;
        if (!waiting) return nullptr;     // every thread is done
        for (Thread& t : b.threads)
            if (t.state == AT_BLOCK_BARRIER) t.state = RUNNABLE;
    }
}

template <class... A, size_t... I>
inline void call(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<A*>(args[I])...);
}

template <class... A>
inline const char* launch(void (*kernel)(A...), void** args, int gx, int gy, int gz, int threads,
                          size_t dynamic_smem) {
    kernel_body() = [=] { call(kernel, args, std::index_sequence_for<A...>{}); };
    // each stack sits above a page that faults, so an overflow stops the run instead of corrupting memory
    const size_t guard = (size_t)sysconf(_SC_PAGESIZE);
    std::vector<char*> stacks(threads);
    for (char*& stack : stacks) {
        char* region = (char*)mmap(nullptr, STACK_BYTES + guard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (region == MAP_FAILED) return "out of memory for thread stacks";
        mprotect(region, guard, PROT_NONE);
        stack = region + guard;
    }
    blockDim = dim3{unsigned(threads), 1, 1};
    gridDim = dim3{unsigned(gx), unsigned(gy), unsigned(gz)};
    for (int z = 0; z < gz; ++z)
        for (int y = 0; y < gy; ++y)
            for (int x = 0; x < gx; ++x) {
                blockIdx = dim3{unsigned(x), unsigned(y), unsigned(z)};
                if (const char* error = run_block(threads, stacks, dynamic_smem)) return error;
            }
    return nullptr;
}

}  // namespace emu

// The emulator's command line: grid x y z, threads, dynamic shared bytes, then one file per kernel
// argument (operands, then the output), mapped shared so the output lands in its file.
#define TESSERA_EMULATOR_MAIN(kernel)                                                              \
    int main(int argc, char** argv) {                                                              \
        if (argc < 6) { std::fprintf(stderr, "usage: %s gx gy gz threads smem files...\n", argv[0]); return 2; } \
        std::vector<void*> pointers(argc - 6);                                                     \
        std::vector<void*> args(argc - 6);                                                         \
        for (int i = 6; i < argc; ++i) {                                                           \
            const int fd = open(argv[i], O_RDWR);                                                  \
            struct stat st;                                                                        \
            if (fd < 0 || fstat(fd, &st)) { std::perror(argv[i]); return 2; }                      \
            void* p = st.st_size ? mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : nullptr; \
            if (p == MAP_FAILED) { std::perror(argv[i]); return 2; }                               \
            pointers[i - 6] = p;                                                                   \
            args[i - 6] = &pointers[i - 6];                                                        \
        }                                                                                          \
        const char* error = emu::launch(kernel, args.data(), std::atoi(argv[1]), std::atoi(argv[2]), \
                                        std::atoi(argv[3]), std::atoi(argv[4]), std::strtoull(argv[5], nullptr, 10)); \
        if (error) { std::fprintf(stderr, "%s\n", error); return 3; }                             \
        return 0;                                                                                  \
    }
