// The emulator's scheduler and command line, compiled once (beside the precompiled prelude) and
// linked into each kernel's program; emulator_runtime.h says how a block runs.
#include "tessera_emulator.h"

#include <random>

namespace emu {

#if defined(__x86_64__)
// switch_context(from, to): push rbp, rbx, r12-r15 and the SSE and x87 control words, leave the
// stack pointer in from.stack_pointer, take to's, pop what it pushed and return where it called
// from (or, the first time, into the entry start_context put there).
asm(R"(
    .text
    .globl emu_switch_stacks
    .type emu_switch_stacks, @function
emu_switch_stacks:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch_stacks, .-emu_switch_stacks
)");
extern "C" void emu_switch_stacks(void** save, void* load);

void switch_context(Context& from, Context& to) { emu_switch_stacks(&from.stack_pointer, to.stack_pointer); }

void start_context(Context& context, char* stack, size_t bytes, void (*entry)()) {
    // from the top, 16-byte aligned: a null return address for `entry` (entered as if called, the
    // stack 8 past a 16-byte boundary), `entry` for the first switch's ret, six zero registers,
    // then the control words this thread runs with
    auto* top = (unsigned long long*)((uintptr_t)(stack + bytes) & ~(uintptr_t)15);
    top[-1] = 0;
    top[-2] = (unsigned long long)entry;
    for (int i = 3; i <= 8; ++i) top[-i] = 0;
    unsigned words[2];
    asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(words[0]), "=m"(words[1]));
    std::memcpy(&top[-9], words, sizeof words);
    context.stack_pointer = &top[-9];
}
#else
void switch_context(Context& from, Context& to) { swapcontext(&from.context, &to.context); }

void start_context(Context& context, char* stack, size_t bytes, void (*entry)()) {
    getcontext(&context.context);
    context.context.uc_stack.ss_sp = stack;
    context.context.uc_stack.ss_size = bytes;
    context.context.uc_link = nullptr;
    makecontext(&context.context, entry, 0);
}
#endif

static void thread_entry() {
    kernel_body()();
    Block& b = block();
    if (!b.current->mma_groups.empty() || !b.current->open_mmas.empty())
        fail("a thread finished with wgmmas in flight (wgmma.wait_group 0 before reading their accumulators)");
    b.current->state = DONE;
    switch_context(b.current->context, b.scheduler);
}

static void resume(Thread& t) {
    Block& b = block();
    b.current = &t;
    threadIdx = t.index;
    t.state = RUNNABLE;
    switch_context(b.scheduler, t.context);
}

// Run one block to completion; returns an error message or nullptr.
static const char* run_block(int threads, std::vector<char*>& stacks, size_t dynamic_smem, bool last_warp_first) {
    Block& b = block();
    b.threads.assign(threads, Thread{});
    b.slots.assign(((threads + 31) / 32) * 2 * 32, Slot{});
    b.gathered.assign(((threads + 31) / 32) * 2, 0);
    b.async_reads.assign(dynamic_smem / 16 + 1, 0);
    b.landing_writes.assign(dynamic_smem / 16 + 1, 0);
    if (dynamic_smem) std::memset(dynamic_smem_arena(), 0xFF, dynamic_smem);
#ifdef __linux__
    if (__start_emu_shared) std::memset(__start_emu_shared, 0xFF, __stop_emu_shared - __start_emu_shared);
#endif
    for (int i = 0; i < threads; ++i) {
        Thread& t = b.threads[i];
        t.index.x = i;
        start_context(t.context, stacks[i], STACK_BYTES, thread_entry);
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
            int live = 0, at_warp = 0, at_block = 0, aside = 0;
            for (int l = first; l < last; ++l) {
                const State s = b.threads[l].state;
                live += s != DONE;
                at_warp += s == AT_WARP_BARRIER;
                at_block += s == AT_BLOCK_BARRIER;
                aside += s == POLLING || s == STEPPED_ASIDE;
            }
            if (at_warp && at_block)
                return "a warp's lanes wait at different barriers (a divergent __syncthreads or warp collective)";
            if (!at_warp || aside) return nullptr;     // a collective waits for the lanes that stepped aside
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
            polling |= t.state == POLLING || t.state == STEPPED_ASIDE;
        }
        if (polling) {
            // a __syncthreads waits for the polling threads too; they poll again unless nothing
            // they wait on changed in a whole round, in which case nothing ever will
            if (b.progress == progress)
                return "deadlock: threads wait on mbarrier phases that never complete (a wait on the wrong parity, "
                       "fewer arrivals or transaction bytes than the barrier expects, or a __syncthreads a waiting "
                       "thread never reaches)";
            for (Thread& t : b.threads)
                if (t.state == POLLING || t.state == STEPPED_ASIDE) t.state = RUNNABLE;
            continue;
        }
        if (!waiting) {                   // every thread is done
            for (const auto& [bar, m] : b.mbarriers)
                if (!m.landing.empty())
                    return "TMA: a block ended with copies into its shared memory in flight (every copy's mbarrier "
                           "phase must be waited on before the block exits)";
            return nullptr;
        }
        for (Thread& t : b.threads)
            if (t.state == AT_BLOCK_BARRIER) t.state = RUNNABLE;
    }
}

// The order blocks run in, as linear indices (x fastest): ascending unless the environment's
// TESSERA_EMULATOR_BLOCK_ORDER says "reverse" or "shuffle:<seed>". A kernel whose blocks meet
// through global memory (counters, atomics) must be right in any order, as on a GPU.
static std::vector<long long> block_order(long long blocks) {
    std::vector<long long> order(blocks);
    for (long long i = 0; i < blocks; ++i) order[i] = i;
    const char* how = std::getenv("TESSERA_EMULATOR_BLOCK_ORDER");
    if (how && !std::strcmp(how, "reverse")) {
        std::reverse(order.begin(), order.end());
    } else if (how && !std::strncmp(how, "shuffle:", 8)) {
        std::mt19937_64 rng(std::strtoull(how + 8, nullptr, 10));
        std::shuffle(order.begin(), order.end(), rng);
    }
    return order;
}

// Run the bound kernel over the grid, `threads` per block; returns an error message or nullptr.
static const char* launch_grid(int gx, int gy, int gz, int threads, size_t dynamic_smem) {
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
    for (const long long linear : block_order((long long)gx * gy * gz)) {
        const int x = int(linear % gx), y = int(linear / gx % gy), z = int(linear / ((long long)gx * gy));
        blockIdx = dim3{unsigned(x), unsigned(y), unsigned(z)};
        const bool last_warp_first = linear % 2 == 0;
        if (const char* error = run_block(threads, stacks, dynamic_smem, last_warp_first)) return error;
    }
    return nullptr;
}

// Parse "operand,element_bytes,swizzle,rank,dims...,strides of dims 1..,box..." over the mapped
// argument files: the map of the tensor in file `operand`. Returns an error or nullptr.
const char* tensor_map(const char* spec, const std::vector<void*>& pointers, const std::vector<size_t>& sizes,
                              TmaMap* map) {
    std::vector<long long> v;
    for (const char* p = spec; *p;) {
        char* end;
        v.push_back(std::strtoll(p, &end, 10));
        if (end == p) return "not a list of integers";
        p = *end == ',' ? end + 1 : end;
    }
    if (v.size() < 4) return "too short";
    const int operand = (int)v[0], rank = (int)v[3];
    if (rank < 1 || rank > 5 || v.size() != 4 + 3 * (size_t)rank - 1) return "rank and lengths disagree";
    if (operand < 0 || operand >= (int)pointers.size()) return "names an argument file that does not come before it";
    *map = TmaMap{(const unsigned char*)pointers[operand], rank, (int)v[1], (int)v[2], {}, {}, {}};
    long long last = map->element_bytes;          // one past the furthest byte the map reaches
    for (int d = 0; d < rank; ++d) {
        map->dims[d] = v[4 + d];
        map->strides[d] = d ? v[4 + rank + d - 1] : map->element_bytes;
        map->box[d] = (int)v[4 + 2 * rank - 1 + d];
        if (map->dims[d] < 1 || map->box[d] < 1 || map->box[d] > 256) return "an extent or box is out of range";
        if (d && map->strides[d] % 16) return "a stride is not a multiple of 16 bytes";
        last += (map->dims[d] - 1) * map->strides[d];
    }
    if ((uintptr_t)map->base % 16) return "the tensor does not start 16-byte aligned";
    if ((size_t)last > sizes[operand]) return "the map reaches past the end of its tensor";
    if (map->swizzle && map->box[0] * map->element_bytes != map->swizzle)
        return "the emulator swizzles boxes whose inner extent spans the swizzle exactly";
    return nullptr;
}

// The command line: which of the program's kernels, grid x y z, threads, dynamic shared bytes, then
// one file per kernel argument (operands, then the output), mapped shared so the output lands in
// its file, then one `tma=...` per TMA tensor map the kernel takes after them (tensor_map, over those
// files).
int run_main(int argc, char** argv, const Binder* kernels, int count) {
    if (argc < 7) {
        std::fprintf(stderr, "usage: %s kernel gx gy gz threads smem files... tma=...\n", argv[0]);
        return 2;
    }
    const int which = std::atoi(argv[1]);
    if (which < 0 || which >= count) {
        std::fprintf(stderr, "%s: no kernel %s (this program holds %d)\n", argv[0], argv[1], count);
        return 2;
    }
    std::vector<void*> pointers, args;
    std::vector<size_t> sizes;
    std::vector<TmaMap> maps;
    maps.reserve(argc);
    pointers.reserve(argc);
    for (int i = 7; i < argc; ++i) {
        if (!std::strncmp(argv[i], "tma=", 4)) {
            const char* error = tensor_map(argv[i] + 4, pointers, sizes, &maps.emplace_back());
            if (error) { std::fprintf(stderr, "%s: %s\n", argv[i], error); return 2; }
            args.push_back(&maps.back());
            continue;
        }
        const int fd = open(argv[i], O_RDWR);
        struct stat st;
        if (fd < 0 || fstat(fd, &st)) { std::perror(argv[i]); return 2; }
        void* p = st.st_size ? mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : nullptr;
        if (p == MAP_FAILED) { std::perror(argv[i]); return 2; }
        pointers.push_back(p);
        sizes.push_back(st.st_size);
        args.push_back(&pointers.back());
    }
    const char* error = kernels[which](args.data(), (int)args.size());
    if (!error)
        error = launch_grid(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]),
                            std::strtoull(argv[6], nullptr, 10));
    if (error) { std::fprintf(stderr, "%s\n", error); return 3; }
    return 0;
}

}  // namespace emu
