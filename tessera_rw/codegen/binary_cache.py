"""The on-disk cache of compiled kernels: cubins keyed by source, NVRTC version and arch.

A generated kernel compiles in 0.1–2 s; a plan has a handful and a tuning sweep hundreds, so
each cubin is kept across processes. The store is cuda.core's `FileStreamProgramCache` (atomic
writes, size-capped, entries are raw cubins that cuobjdump reads); its key covers the source
text, every compile option, the target arch and the NVRTC version, and we mix in the codegen
version. Beside each cubin the ptxas facts (registers, spills, shared memory) are kept as a JSON
record validated on load; a record that does not validate is a miss, never an error.

Location: `$TESSERA_CACHE_DIR/binaries`, else `~/.tessera/binaries`; `TESSERA_BINARY_CACHE=off`
turns it off.

>>> import tempfile
>>> cache = BinaryCache(tempfile.mkdtemp())
>>> cache.get(b"nothing here", "k", "sm_90") is None
True
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from tessera_rw.support.cache_dir import cache_root

CODEGEN_VERSION = b"tessera_rw-codegen-1"     # bump when the prelude or compile options change meaning
SWITCH_VARIABLE = "TESSERA_BINARY_CACHE"
MAX_BYTES = 2 << 30                           # least recently read cubins go first beyond this


class KernelFacts(BaseModel):
    """What ptxas said about one cubin."""
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    arch: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    smem_bytes: int
    log: str


class BinaryCache:
    def __init__(self, path: str | os.PathLike[str]):
        from cuda.core.utils import FileStreamProgramCache
        self.path = Path(path)
        self._store = FileStreamProgramCache(self.path, max_size_bytes=MAX_BYTES)

    @staticmethod
    def key(full_source: str, options) -> bytes:
        """The entry for `full_source` compiled to a cubin with cuda.core ProgramOptions `options`."""
        from cuda.core.utils import make_program_cache_key
        return make_program_cache_key(code=full_source, code_type="c++", options=options, target_type="cubin",
                                      extra_digest=CODEGEN_VERSION)

    def get(self, key: bytes, name: str, arch: str) -> tuple[bytes, KernelFacts] | None:
        cubin = self._store.get(key)
        record = self._store.get(key + b".facts")
        if cubin is None or record is None:
            return None
        try:
            facts = KernelFacts.model_validate_json(record)
        except ValidationError:
            return None
        if facts.name != name or facts.arch != arch:
            return None
        return cubin, facts

    def put(self, key: bytes, cubin: bytes, facts: KernelFacts) -> None:
        self._store[key] = cubin
        self._store[key + b".facts"] = facts.model_dump_json().encode()


@cache
def _cache_at(path: str) -> BinaryCache | None:
    try:
        return BinaryCache(path)
    except OSError:          # a read-only home: compile every time rather than fail
        return None


def binary_cache() -> BinaryCache | None:
    """The cache for this process's settings, or None when it is switched off or unwritable."""
    if os.environ.get(SWITCH_VARIABLE, "").lower() in ("0", "off", "false", "no"):
        return None
    return _cache_at(str(cache_root() / "binaries"))
