"""How a warp-specialized block (sm_90) shares its register file: one producer warpgroup, whose one
thread issues the TMA copies, and one or two consumer warpgroups computing. A block of two consumers
launches 384 threads, at most 168 registers a thread; the producer lowers its warpgroup's share and
the consumers raise theirs (setmaxnreg), as the GEMM (gemm_tma_cuda.py) and attention
(attention_tma_cuda.py) TMA kernels do.

>>> registers_at_launch(384), registers_at_launch(256)
(168, 255)
>>> print(register_split(2, "inc", 4))
    setmaxnreg_inc<232>();   // registers: to the consumers
>>> register_split(1, "dec", 8)
''
"""

from __future__ import annotations

PRODUCER_REGISTERS, CONSUMER_REGISTERS = 40, 232   # with two consumer warpgroups: 64512 of the 65536
_REGISTER_FILE, _MAX_REGISTERS = 65536, 255         # per SM (and so per block at most), per thread


def registers_at_launch(threads: int) -> int:
    """Registers per thread a block of `threads` launches with when it takes the whole file
    (ptxas allocates in units of 8), as a kernel that redistributes them with setmaxnreg does."""
    return min(_MAX_REGISTERS, _REGISTER_FILE // threads // 8 * 8)


def consumer_room(consumers: int, registers_per_thread: int) -> int:
    """The registers a consumer thread may use: what setmaxnreg raises it to beside a second
    consumer warpgroup, else what one thread may have."""
    return CONSUMER_REGISTERS if consumers == 2 else registers_per_thread


def register_split(consumers: int, change: str, indent: int) -> str:
    """The setmaxnreg moving registers from the producer warpgroup ("dec") to the consumers ("inc"),
    for a block of two consumer warpgroups (384 threads launch with at most 168 a thread, the
    consumers need more); none for a block of one, which launches with 255."""
    if consumers != 2:
        return ""
    count = PRODUCER_REGISTERS if change == "dec" else CONSUMER_REGISTERS
    role = "the producer needs few" if change == "dec" else "to the consumers"
    return f"{' ' * indent}setmaxnreg_{change}<{count}>();   // registers: {role}"
