// The CUDA execution model on one CPU core, for running generated kernels without a GPU.
//
// A block's threads are coroutines run one at a time on one OS thread; blocks run one
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
// poll is a deadlock (a wait on the wrong phase, a missing arrival), reported as an error. A thread
// arriving on an mbarrier (a consumer handing a stage back) steps aside until the threads polling
// run, so a producer refills the stage before the consumer's warp goes on, as it may on a GPU.
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

inline dim3 threadIdx, blockIdx, blockDim, gridDim;

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

// STEPPED_ASIDE: a thread that arrived on an mbarrier lets the threads that barrier wakes run first
enum State { RUNNABLE, AT_BLOCK_BARRIER, AT_WARP_BARRIER, POLLING, STEPPED_ASIDE, DONE };

struct Copy { void* dst; unsigned char bytes[16]; };

// Where a coroutine left off. On x86-64 its stack pointer: switch_context pushes the callee-saved
// registers on the stack it leaves and pops them from the one it enters, and saves no signal mask
// (glibc's swapcontext makes two system calls a switch, most of an elementwise kernel's time).
// Elsewhere a ucontext.
#if defined(__x86_64__)
struct Context { void* stack_pointer = nullptr; };
#else
struct Context { ucontext_t context; };
#endif
// Save the running coroutine in `from` and go on where `to` left off.
void switch_context(Context& from, Context& to);
// Make `context` start `entry` (which never returns) on the `bytes` of stack at `stack`.
void start_context(Context& context, char* stack, size_t bytes, void (*entry)());

struct Thread {
    Context context;
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
enum Collective { SYNCWARP = 1, SHUFFLE, LDMATRIX, MMA, WGMMA_WAIT };

// A TMA copy's bytes, read from global memory when it was issued, written to shared memory when a
// thread's wait on its mbarrier first sees the phase complete (not before: a thread reading the
// tile without waiting reads what was there before); `phase` is the one it completes in.
struct Landing { unsigned address; std::vector<unsigned char> bytes; unsigned phase; };

// An mbarrier's state: arrivals it expects per phase, those still pending in the current phase,
// transaction bytes outstanding (expected less completed), and phases completed so far.
struct Mbarrier {
    int count, pending;
    long long tx;
    unsigned phase;
    std::vector<Landing> landing = {};   // copies complete on it, not yet seen landed by a wait
};

struct Block {
    std::vector<Thread> threads;
    std::map<const void*, Mbarrier> mbarriers;   // by their address in shared memory
    std::map<int, Mbarrier> named_barriers;      // bar.sync's, by id: arrivals pending, generations passed
    unsigned long long progress = 0;             // mbarrier events (init, arrival, transactions, a wait passed)
    std::vector<Slot> slots;                  // [warp][2 buffers][32 lanes]
    std::vector<char> gathered;               // [warp][2 buffers]: a lane has read for all (ldmatrix)
    std::vector<int> async_reads;             // per 16 bytes of dynamic shared memory: wgmmas issued, not retired, reading them
    std::vector<int> landing_writes;          // ... and TMA copies issued, not yet landed, writing them
    Context scheduler;
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
    switch_context(t.context, b.scheduler);
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

// Blocks run one after another and a block's threads take turns on one core, so a read-modify-write
// is atomic as it stands, and every write is visible to every later read (the fences order nothing
// more; __ldcg reads what the last write left).
template <class T> inline T atomicAdd(T* p, T v) { const T old = *p; *p = old + v; return old; }
inline void __threadfence() {}
inline float4 __ldcg(const float4* p) { return *p; }
inline int __ffs(int x) { return __builtin_ffs(x); }

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

// The scheduler (blocks run one after another, their threads as coroutines) and the command line
// live in emulator_runtime.cpp, compiled once beside the precompiled prelude and linked into every
// kernel's program: compiled with each kernel, they were most of its compile time. A program holds
// one or more kernels; its first argument picks one, whose Binder makes it the body the threads
// run; the rest of the command line says how to launch it.
using Binder = const char* (*)(void** args, int nargs);
int run_main(int argc, char** argv, const Binder* kernels, int count);

template <class... A, size_t... I>
inline void call(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<A*>(args[I])...);
}

// Make `kernel`, over the argument pointers `args`, the body every thread runs.
template <class... A>
inline const char* bind_kernel(void (*kernel)(A...), void** args, int nargs) {
    if (nargs != (int)sizeof...(A)) return "the launch passes a different number of arguments than the kernel takes";
    kernel_body() = [=] { call(kernel, args, std::index_sequence_for<A...>{}); };
    return nullptr;
}

}  // namespace emu
