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
// A thread waiting on an mbarrier (mbar_try_wait failing) yields too, and is polled again after
// every other thread has run as far as it can; a round in which no mbarrier changes while threads
// poll is a deadlock (a wait on the wrong phase, a missing arrival), reported as an error.
//
// __shared__ variables are static locals, one copy shared by the threads of the running block;
// dynamic shared memory is one arena ending against a page that faults. Both are filled with 0xFF
// (NaN in every float type) before each block, and so is the top of every thread's stack.
// Misaligned ldmatrix and cp.async addresses, and lanes of one warp at different collectives,
// stop the run with a message, as the device would fault.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <functional>
#include <map>
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
#define __grid_constant__
// __shared__ variables are static, gathered in one section (on Linux) so that each block starts with
// them filled with 0xFF, as a block's shared memory starts with whatever was there
#ifdef __linux__
#define __shared__ static __attribute__((section("emu_shared")))
extern "C" char __start_emu_shared[] __attribute__((weak));
extern "C" char __stop_emu_shared[] __attribute__((weak));
#else
#define __shared__ static
#endif

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
// prmt: byte i of the result is byte (s >> 4i) & 7 of the eight bytes y:x (x the low four)
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long xy = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((xy >> (8 * ((s >> (4 * i)) & 7))) & 0xffu) << (8 * i);
    return r;
}
inline long long __double_as_longlong(double d) { return emu_bits<long long>(d); }

namespace emu {

enum State { RUNNABLE, AT_BLOCK_BARRIER, AT_WARP_BARRIER, POLLING, DONE };

struct Copy { void* dst; unsigned char bytes[16]; };

struct Thread {
    ucontext_t context;
    State state = RUNNABLE;
    dim3 index;
    unsigned collectives = 0;                 // warp collectives passed: picks the exchange buffer
    std::vector<Copy> open_group;             // cp.async copies not yet committed
    std::vector<std::vector<Copy>> groups;    // committed groups, oldest first
    std::vector<std::function<void()>> open_mmas;              // wgmmas issued since the last commit
    std::vector<std::vector<std::function<void()>>> mma_groups; // committed wgmma groups, oldest first
};

// One lane's published operands at a warp collective, and which collective it is at.
struct Slot { unsigned words[8]; const void* pointer; double value; int kind; };
enum Collective { SYNCWARP = 1, SHUFFLE, LDMATRIX, MMA };

// An mbarrier's state: arrivals it expects per phase, those still pending in the current phase,
// transaction bytes outstanding (expected less completed), and phases completed so far.
struct Mbarrier { int count, pending; long long tx; unsigned phase; };

struct Block {
    std::vector<Thread> threads;
    std::map<const void*, Mbarrier> mbarriers;   // by their address in shared memory
    std::map<int, Mbarrier> named_barriers;      // bar.sync's, by id: arrivals pending, generations passed
    unsigned long long progress = 0;             // mbarrier events (init, arrival, transactions, a wait passed)
    std::vector<Slot> slots;                  // [warp][2 buffers][32 lanes]
    std::vector<char> gathered;               // [warp][2 buffers]: a lane has read for all (ldmatrix)
    std::vector<int> async_reads;             // per 16 bytes of dynamic shared memory: wgmmas issued, not retired, reading them
    ucontext_t scheduler;
    Thread* current = nullptr;
};

inline Block& block() { static Block b; return b; }

inline Thread& self() { return *block().current; }

// Stop the run: a fault the device would report (misaligned or out-of-bounds access, mismatched
// collectives). The message names the block and thread.
[[noreturn]] inline void fail(const char* what) {
    const Block& b = block();
    if (b.current)
        std::fprintf(stderr, "%s (block %u,%u,%u thread %u)\n", what, blockIdx.x, blockIdx.y, blockIdx.z,
                     b.current->index.x);
    else
        std::fprintf(stderr, "%s\n", what);
    std::fflush(stderr);
    _exit(3);
}

// The dynamic shared memory: `bytes` ending against a page that faults, so a kernel reading or
// writing past what its launch asked for stops instead of reading the heap.
inline unsigned char*& dynamic_smem_arena() { static unsigned char* arena = nullptr; return arena; }
inline size_t& dynamic_smem_bytes() { static size_t bytes = 0; return bytes; }
// where `p` lies in dynamic shared memory, in bytes from its start; -1 when it lies elsewhere
inline long dynamic_smem_offset(const void* p) {
    const unsigned char *arena = dynamic_smem_arena(), *at = (const unsigned char*)p;
    return arena && at >= arena && (size_t)(at - arena) < dynamic_smem_bytes() ? (long)(at - arena) : -1;
}
inline void allocate_dynamic_smem(size_t bytes) {
    dynamic_smem_bytes() = bytes;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t rounded = (bytes + 127) / 128 * 128, span = (rounded + page - 1) / page * page;
    char* region = (char*)mmap(nullptr, span + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED) fail("out of memory for dynamic shared memory");
    mprotect(region + span, page, PROT_NONE);
    dynamic_smem_arena() = (unsigned char*)region + span - rounded;
}
inline int lane() { return self().index.x % 32; }     // blocks are 1-d in every generated kernel
inline int warp() { return self().index.x / 32; }

inline void yield(State state) {
    Block& b = block();
    Thread& t = *b.current;
    t.state = state;
    swapcontext(&t.context, &b.scheduler);
}

inline Slot* warp_slots(unsigned buffer) { return &block().slots[(warp() * 2 + buffer) * 32]; }

// Publish this lane's slot for collective `kind`, wait for the warp, and return the warp's 32 slots
// to read from (and whether this lane is the first to read them: `*first`).
inline Slot* exchange(Slot mine, int kind, bool* first = nullptr) {
    Thread& t = self();
    const unsigned buffer = t.collectives++ & 1;
    Block& b = block();
    Slot* slots = warp_slots(buffer);
    char& gathered = b.gathered[warp() * 2 + buffer];
    mine.kind = kind;
    slots[lane()] = mine;
    gathered = 0;
    yield(AT_WARP_BARRIER);
    const int lanes = std::min(32, (int)blockDim.x - warp() * 32);
    for (int l = 0; l < lanes; ++l)
        if (slots[l].kind != kind) fail("the lanes of a warp met at different collectives (divergent code)");
    if (first) *first = !gathered;
    gathered = 1;
    return slots;
}

inline void apply(const std::vector<Copy>& group) {
    for (const Copy& c : group) std::memcpy(c.dst, c.bytes, 16);
}

}  // namespace emu

inline void __syncthreads() { emu::yield(emu::AT_BLOCK_BARRIER); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::exchange(emu::Slot{}, emu::SYNCWARP); }

namespace emu {

// A shuffle: every lane publishes v, and reads lane `from`'s value when `from` lies in its own
// segment of `width` lanes (else keeps its own, as the hardware does).
template <class T> inline T shuffle(T v, int from, int width) {
    static_assert(sizeof(T) <= sizeof(double), "a shuffle moves at most 8 bytes");
    Slot mine{};
    std::memcpy(&mine.value, &v, sizeof v);
    const Slot* s = exchange(mine, SHUFFLE);
    T r = v;
    if (from >= 0 && from < 32 && from / width == lane() / width) std::memcpy(&r, &s[from].value, sizeof r);
    return r;
}

}  // namespace emu

template <class T> inline T __shfl_xor_sync(unsigned, T v, int lane_mask, int width = 32) {
    return emu::shuffle(v, emu::lane() ^ lane_mask, width);
}
template <class T> inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
    return emu::shuffle(v, (emu::lane() / width) * width + (src & (width - 1)), width);
}
template <class T> inline T __shfl_down_sync(unsigned, T v, int delta, int width = 32) {
    return emu::shuffle(v, emu::lane() + delta, width);
}

namespace emu {

constexpr size_t STACK_BYTES = 256 * 1024;
constexpr size_t POISONED_STACK_BYTES = 32 * 1024;

inline std::function<void()>& kernel_body() { static std::function<void()> f; return f; }

inline void thread_entry() {
    kernel_body()();
    Block& b = block();
    if (!b.current->mma_groups.empty() || !b.current->open_mmas.empty())
        fail("a thread finished with wgmmas in flight (wgmma.wait_group 0 before reading their accumulators)");
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
inline const char* run_block(int threads, std::vector<char*>& stacks, size_t dynamic_smem, bool last_warp_first) {
    Block& b = block();
    b.threads.assign(threads, Thread{});
    b.slots.assign(((threads + 31) / 32) * 2 * 32, Slot{});
    b.gathered.assign(((threads + 31) / 32) * 2, 0);
    b.async_reads.assign(dynamic_smem / 16 + 1, 0);
    if (dynamic_smem) std::memset(dynamic_smem_arena(), 0xFF, dynamic_smem);
#ifdef __linux__
    if (__start_emu_shared) std::memset(__start_emu_shared, 0xFF, __stop_emu_shared - __start_emu_shared);
#endif
    for (int i = 0; i < threads; ++i) {
        Thread& t = b.threads[i];
        t.index.x = i;
        getcontext(&t.context);
        t.context.uc_stack.ss_sp = stacks[i];
        t.context.uc_stack.ss_size = STACK_BYTES;
        t.context.uc_link = nullptr;
        makecontext(&t.context, thread_entry, 0);
    }
    // Warps run one at a time, each as far as it gets (through its warp collectives) before the
    // next starts, the last first or the first first (alternate blocks): a warp reads what another
    // has not yet written when a __syncthreads is missing, whichever way the data flows.
    const int warps = (threads + 31) / 32;
    b.mbarriers.clear();
    b.named_barriers.clear();
    auto run_warp = [&](int w) -> const char* {
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
            if (!at_warp) return nullptr;
            if (live != last - first) return "a warp collective ran after some of its warp's lanes had exited";
            for (int l = first; l < last; ++l) b.threads[l].state = RUNNABLE;
        }
    };
    while (true) {
        const unsigned long long progress = b.progress;
        for (int i = 0; i < warps; ++i) {
            const unsigned long long before = b.progress;
            if (const char* error = run_warp(last_warp_first ? warps - 1 - i : i)) return error;
            if (b.progress == before) continue;
            // an mbarrier changed: the threads polling it go on at once, before the next warp runs, as
            // a producer refills a stage the moment its last consumer releases it
            for (int v = 0; v < warps; ++v) {
                bool woken = false;
                for (int l = v * 32; l < std::min(threads, v * 32 + 32); ++l)
                    if (b.threads[l].state == POLLING) {
                        b.threads[l].state = RUNNABLE;
                        woken = true;
                    }
                if (woken)
                    if (const char* error = run_warp(v)) return error;
            }
        }
        bool waiting = false, polling = false;
        for (Thread& t : b.threads) {
            waiting |= t.state == AT_BLOCK_BARRIER;
            polling |= t.state == POLLING;
        }
        if (polling) {
            // a __syncthreads waits for the polling threads too; they poll again unless nothing
            // they wait on changed in a whole round, in which case nothing ever will
            if (b.progress == progress)
                return "deadlock: threads wait on mbarrier phases that never complete (a wait on the wrong parity, "
                       "fewer arrivals or transaction bytes than the barrier expects, or a __syncthreads a waiting "
                       "thread never reaches)";
            for (Thread& t : b.threads)
                if (t.state == POLLING) t.state = RUNNABLE;
            continue;
        }
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
inline const char* launch(void (*kernel)(A...), void** args, int nargs, int gx, int gy, int gz, int threads,
                          size_t dynamic_smem) {
    if (nargs != (int)sizeof...(A)) return "the launch passes a different number of arguments than the kernel takes";
    kernel_body() = [=] { call(kernel, args, std::index_sequence_for<A...>{}); };
    if (dynamic_smem) allocate_dynamic_smem(dynamic_smem);
    // each stack sits above 64 KiB that fault, so an overflow stops the run instead of corrupting
    // memory; its top (where the frames are) starts as 0xFF bytes, so a register the kernel reads
    // before writing holds NaN, not zero
    const size_t guard = 64 * 1024;
    std::vector<char*> stacks(threads);
    for (char*& stack : stacks) {
        char* region = (char*)mmap(nullptr, STACK_BYTES + guard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (region == MAP_FAILED) return "out of memory for thread stacks";
        mprotect(region, guard, PROT_NONE);
        stack = region + guard;
        std::memset(stack + STACK_BYTES - POISONED_STACK_BYTES, 0xFF, POISONED_STACK_BYTES);
    }
    blockDim = dim3{unsigned(threads), 1, 1};
    gridDim = dim3{unsigned(gx), unsigned(gy), unsigned(gz)};
    for (int z = 0; z < gz; ++z)
        for (int y = 0; y < gy; ++y)
            for (int x = 0; x < gx; ++x) {
                blockIdx = dim3{unsigned(x), unsigned(y), unsigned(z)};
                const bool last_warp_first = (x + gx * (y + gy * z)) % 2 == 0;
                if (const char* error = run_block(threads, stacks, dynamic_smem, last_warp_first)) return error;
            }
    return nullptr;
}

}  // namespace emu

// The emulator's command line: grid x y z, threads, dynamic shared bytes, then one file per kernel
// argument (operands, then the output), mapped shared so the output lands in its file, then one
// `tma=...` per TMA tensor map the kernel takes after them (emu::tensor_map, over those files).
#define TESSERA_EMULATOR_MAIN(kernel)                                                              \
    int main(int argc, char** argv) {                                                              \
        if (argc < 6) { std::fprintf(stderr, "usage: %s gx gy gz threads smem files... tma=...\n", argv[0]); return 2; } \
        std::vector<void*> pointers, args;                                                         \
        std::vector<size_t> sizes;                                                                 \
        std::vector<TmaMap> maps;                                                                  \
        maps.reserve(argc);                                                                        \
        pointers.reserve(argc);                                                                    \
        for (int i = 6; i < argc; ++i) {                                                           \
            if (!std::strncmp(argv[i], "tma=", 4)) {                                               \
                const char* error = emu::tensor_map(argv[i] + 4, pointers, sizes, &maps.emplace_back()); \
                if (error) { std::fprintf(stderr, "%s: %s\n", argv[i], error); return 2; }        \
                args.push_back(&maps.back());                                                      \
                continue;                                                                          \
            }                                                                                      \
            const int fd = open(argv[i], O_RDWR);                                                  \
            struct stat st;                                                                        \
            if (fd < 0 || fstat(fd, &st)) { std::perror(argv[i]); return 2; }                      \
            void* p = st.st_size ? mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : nullptr; \
            if (p == MAP_FAILED) { std::perror(argv[i]); return 2; }                               \
            pointers.push_back(p);                                                                 \
            sizes.push_back(st.st_size);                                                           \
            args.push_back(&pointers.back());                                                      \
        }                                                                                          \
        const char* error = emu::launch(kernel, args.data(), (int)args.size(), std::atoi(argv[1]), std::atoi(argv[2]), \
                                        std::atoi(argv[3]), std::atoi(argv[4]), std::strtoull(argv[5], nullptr, 10)); \
        if (error) { std::fprintf(stderr, "%s\n", error); return 3; }                             \
        return 0;                                                                                  \
    }
