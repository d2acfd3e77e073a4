"""The persistent autotune cache: tuning results kept across processes, safe under crashes and races.

One JSON document per (cache name, arch) at `<root>/<name>/<arch>.json`, root being
`$TESSERA_CACHE_DIR/autotune` else `~/.tessera/autotune`. Why each rule holds:

- Writers take a file lock, re-read the file and merge, so records another process wrote in the
  meantime are never lost; the new document goes to a temp file in the same folder, is fsynced,
  then `os.replace`d over the old one, so a reader or a crash only ever sees a whole file.
- A writer that cannot read the file it would replace writes nothing (TuneCacheError): replacing
  what it could not read would drop every record in it. Tuning writes with `put_or_warn`: a cache
  that cannot be written (a read-only HOME) costs a warning, never the tuning result.
- Readers validate every record (pydantic, `TuneRecord`); nothing is unpickled or evaluated. A
  record that does not validate (one a newer version wrote), or is of another arch than its file,
  is skipped with a TuneCacheWarning and written back unchanged (see `cache_file`). A file that is
  not JSON, or not a `TuneDocument` at its top level, is moved aside to `<file>.corrupt-<timestamp>`
  with a TuneCacheWarning and counts as empty: a bad file costs a re-tune, never a crash and never
  a wrong schedule. A file that cannot be read is skipped with a warning.
- A validated file is remembered until it changes, and indexed by op, signature, shapes and dtypes,
  so a lookup in an unchanged file costs no parse. A writer validates a changed file before it
  takes the lock, and under the lock parses it again only when another writer replaced it since:
  the lock is held for the merge and the write, a parse only in a race.
- An import is refused past MAX_IMPORT_BYTES, and at its first invalid record.
- For one key, a measurement beats an estimate, a real record an interpolated one, then the
  lower time wins (`TuneRecord.better_than`).

>>> import tempfile
>>> from tessera_rw.tune.records import TuneRecord
>>> cache = TuneCache(root=tempfile.mkdtemp())
>>> cache.put(TuneRecord.create(op_name="matmul", signature_hash="9f2c", shapes=((128, 64), (64, 256)),
...     dtypes=("bf16", "bf16"), arch="H100-SXM", config={"bm": 128}, time_us=12.5, chosen_by="on_device"))
True
>>> cache.get("matmul", "9f2c", ((128, 64), (64, 256)), ("bf16", "bf16"), "H100-SXM").config
{'bm': 128}
>>> cache.nearest("matmul", ((128, 64), (64, 512)), ("bf16", "bf16"), "H100-SXM").interpolated
True
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout
from pydantic import ValidationError

from tessera_rw.algebra.builder import warn_at_user_line
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.codegen.arch import ArchError, ArchSpec, arch_named
from tessera_rw.support.atomic_files import remove_stale_temps, set_aside, write_atomically
from tessera_rw.support.cache_dir import cache_root
from tessera_rw.tune.cache_file import (
    EMPTY, ArchFile, FileStamp, NewerFile, first_problem, newer_format, ranks_of, read_ahead, read_arch_file,
    record_order, remember)
from tessera_rw.tune.records import (
    FILE_NAME_PATTERN, SCHEMA, ChosenBy, TuneDocument, TuneRecord, arch_name, canonical_dtypes, canonical_shapes,
    current_versions, document_json)

LOCK_TIMEOUT_S = 60.0            # a write holds the lock for under a second; a minute means something is stuck
MAX_IMPORT_BYTES = 64 << 20      # ~130k records; anything bigger is not an export of ours
MAX_INTERPOLATION_FACTOR = 8    # how far off (per dimension) a tuned shape may answer for an unseen one
RECORD_BYTES = 500               # a record's line in a file, config of half a dozen entries
_NAME = re.compile(FILE_NAME_PATTERN)


class TuneCacheWarning(UserWarning):
    """A cache file or some of its records could not be used (unreadable, invalid: moved aside,
    skipped), or a tuning result could not be kept; the tuning itself goes on."""


class TuneCacheError(TesseraError):
    """A cache that cannot be written, or a file that cannot be imported."""


class NewerFileError(TuneCacheError):
    """A cache file a newer tessera_rw wrote, which this one neither rewrites nor deletes."""


_warned: set[tuple[str, str]] = set()


def warn_once(path: Path, about: str, message: str) -> None:
    """A TuneCacheWarning at the user's line, unless this process already warned `about` this file:
    a tuning run touches a file once per kernel, and one line says it all."""
    if (str(path), about) not in _warned:
        _warned.add((str(path), about))
        warn_at_user_line(TuneCacheWarning(message))


def _within_reach(a: tuple[tuple[int, ...], ...], b: tuple[tuple[int, ...], ...]) -> bool:
    """Whether every dimension of `a` is within MAX_INTERPOLATION_FACTOR of `b`'s: further off, a
    tuned config says little (a 4096³ product's tiles for an 8³ one)."""
    return all(max(x, 1) <= max(y, 1) * MAX_INTERPOLATION_FACTOR and max(y, 1) <= max(x, 1) * MAX_INTERPOLATION_FACTOR
               for sa, sb in zip(a, b) for x, y in zip(sa, sb))


def _log2_distance(a: tuple[tuple[int, ...], ...], b: tuple[tuple[int, ...], ...]) -> float:
    """Sum over dims of |log2(a/b)|: 64 vs 128 is as far as 4096 vs 8192. Empty dims count as 1."""
    return sum(abs(math.log2(max(x, 1) / max(y, 1))) for sa, sb in zip(a, b) for x, y in zip(sa, sb))


class TuneCache:
    """The records of one named cache, one file per arch, shared by every process on the machine.
    A `read_only` one reads the same records and writes none (what explaining a program uses)."""

    def __init__(self, name: str = "default", root: str | os.PathLike[str] | None = None, *,
                 read_only: bool = False):
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise TuneCacheError(f"autotune cache name {name!r} is not a plain file name",
                                 hint="use letters, digits, '.', '_' or '-', starting with a letter or digit")
        self.name = name
        self.root = Path(root).expanduser() if root is not None else cache_root() / "autotune"
        self.folder = self.root / name
        self.read_only = read_only

    def __repr__(self) -> str:
        return f"TuneCache({self.name!r}, root={str(self.root)!r})"

    def path(self, arch: ArchSpec | str) -> Path:
        """The file that holds this cache's records for `arch`. A described ArchSpec named like a
        known GPU but differing from it is refused: its records would answer for that GPU."""
        _check_own_name(arch)
        name = arch_name(arch)
        if not _NAME.fullmatch(name):
            raise TuneCacheError(f"arch name {name!r} cannot name a cache file",
                                 hint="give the ArchSpec a name of letters, digits, '.', '_' or '-'")
        return self.folder / f"{name}.json"

    def names_beside(self) -> list[str]:
        """The named caches under this cache's root, its own among them when it has a folder."""
        return sorted(p.name for p in self.root.glob("*") if p.is_dir()) if self.root.is_dir() else []

    def archs(self) -> list[str]:
        """The archs this cache holds a file for."""
        if not self.folder.is_dir():
            return []
        return sorted(p.stem for p in self.folder.glob("*.json") if _NAME.fullmatch(p.stem))

    # ---- reading ----

    def records(self, arch: ArchSpec | str | None = None) -> list[TuneRecord]:
        """Every record of this cache (of one arch when given), in a stable order."""
        archs = [arch_name(arch)] if arch is not None else self.archs()
        return sorted((r for a in archs for r in self._file_of(a).records), key=record_order)

    def get(self, op_name: str, signature_hash: str, shapes: Sequence[Sequence[int]], dtypes: Sequence[object],
            arch: ArchSpec | str) -> TuneRecord | None:
        """The record for exactly this kernel on `arch` under this process's versions, else None.

        >>> import tempfile
        >>> TuneCache(root=tempfile.mkdtemp()).get("matmul", "9f2c", [(8, 8)], ["f32"], "h100") is None
        True
        """
        shapes, dtypes, versions = canonical_shapes(shapes), canonical_dtypes(dtypes), current_versions()
        found = None           # a measurement under these versions beats an estimate made anywhere
        for r in self._file_of(arch).exact(op_name, signature_hash, shapes, dtypes):
            if r.holds_under(versions) and _same_spec(r, arch) and (found is None or r.better_than(found)):
                found = r
        return found

    def nearest(self, op_name: str, shapes: Sequence[Sequence[int]], dtypes: Sequence[object],
                arch: ArchSpec | str, *, signature_hash: str | None = None) -> TuneRecord | None:
        """For a shape never tuned: the record of the same op, dtypes, arch and versions (and signature,
        when given) whose operand shapes of the same ranks are nearest in log2 space, each dimension
        within MAX_INTERPOLATION_FACTOR, as a copy marked `interpolated=True` (its shapes and time are
        the source's). None when there is none.
        Interpolated records are never a source, so guesses do not compound.

        >>> import tempfile
        >>> TuneCache(root=tempfile.mkdtemp()).nearest("matmul", [(8, 8)], ["f32"], "h100") is None
        True
        """
        shapes, dtypes, versions = canonical_shapes(shapes), canonical_dtypes(dtypes), current_versions()
        sources = [r for r in self._file_of(arch).sources(op_name, dtypes, versions, ranks_of(shapes))
                   if signature_hash in (None, r.signature_hash) and _same_spec(r, arch)
                   and _within_reach(r.shapes, shapes)]
        if not sources:
            return None
        ranked = [((_log2_distance(r.shapes, shapes), r.chosen_by is not ChosenBy.ON_DEVICE, r.time_us), r)
                  for r in sources]
        low = min(rank for rank, _ in ranked)
        best = min((r for rank, r in ranked if rank == low), key=lambda r: r.key)   # keys cost: ties only
        return best.model_copy(update={"interpolated": True})

    def _file_of(self, arch: ArchSpec | str) -> ArchFile:
        return self._load(self.path(arch), arch_name(arch))

    def _load(self, path: Path, arch: str, *, locked: bool = False) -> ArchFile:
        """What the file of `arch` holds, from memory when the file is unchanged since it was last
        validated. Unlocked (a reader), an unreadable file is skipped with a warning; `locked` (a
        writer, under the lock), it is a TuneCacheError, so it is never replaced."""
        try:
            found = read_arch_file(path, arch)
        except FileNotFoundError:
            return EMPTY
        except OSError as e:
            if locked:
                raise TuneCacheError(f"cannot read the autotune cache {path} ({e.strerror or e}), so it was left "
                                     "as it is: rewriting it unread would lose the records it holds",
                                     hint="make the file readable by this user, or move it away to start "
                                          "afresh") from None
            warn_once(path, "unreadable", f"autotune cache file {path} cannot be read ({e.strerror or e}); ignored")
            return EMPTY
        if isinstance(found, NewerFile):
            if locked:
                raise NewerFileError(f"autotune cache file {path} {found}: left as it is, not rewritten",
                                     hint="use another TESSERA_CACHE_DIR for this version, or upgrade it")
            warn_once(path, "newer", f"autotune cache file {path} {found}; this version leaves it as it is and "
                      "does not use it")
            return EMPTY
        if isinstance(found, ArchFile):
            if found.skipped is not None:
                # keyed by the records skipped, not the note: their indices move when the file is rewritten
                warn_once(path, f"skipped {hash(found.kept)}", f"autotune cache file {path}: {found.skipped}; "
                          "this version does not use them and keeps them in the file as they are")
            return found
        return self._set_aside_or_skip(path, arch, problem=found, locked=locked)

    def _set_aside_or_skip(self, path: Path, arch: str, *, problem: str, locked: bool) -> ArchFile:
        if not locked:
            # Look again under the lock: a writer may have replaced the file since, and only the
            # bad file itself may be moved aside, never the good one that replaced it.
            try:
                with self._locked(path):
                    return self._load(path, arch, locked=True)
            except (OSError, TuneCacheError) as e:     # a reader never fails on a bad file: it skips it
                reason = e.strerror if isinstance(e, OSError) else str(e).splitlines()[0]
                warn_once(path, "kept bad", f"autotune cache file {path} {problem}; ignored (could not move it "
                          f"aside: {reason})")
                return EMPTY
        aside = set_aside(path)
        warn_at_user_line(TuneCacheWarning(f"autotune cache file {path} {problem}; moved aside to {aside.name} "
                                           "and ignored"))
        return EMPTY

    # ---- writing ----

    def put(self, record: TuneRecord, *, supersede: bool = False) -> bool:
        """Merge `record` into the file of its arch; True when it was added or replaced a worse one
        (never, for a read-only cache); with `supersede` it replaces the record of its key whatever
        that one's time. A TuneCacheError when the file cannot be written."""
        return self._merge_into(record.arch, [record], supersede) > 0

    def put_or_warn(self, record: TuneRecord, *, supersede: bool = False) -> bool:
        """`put` for a tuning result: where the cache cannot be written (a read-only folder or HOME)
        the result is not kept, with a TuneCacheWarning once per file and process, and the tuning
        that made it stands. False then, as for a read-only cache."""
        try:
            return self.put(record, supersede=supersede)
        except TuneCacheError as e:
            hint = f" ({e.hint})" if e.hint else ""
            warn_once(self.path(record.arch), "unwritable",
                      f"{e.detail}; tuning results are used but not kept{hint}")
            return False

    def _merge_into(self, arch: str, incoming: Sequence[TuneRecord], supersede: bool = False) -> int:
        """Merge records of one arch into its file under the lock; how many were added or won (with
        `supersede`, the incoming ones drop the held records of their keys first)."""
        if self.read_only:
            return 0
        path = self.path(arch)
        read_ahead(path, arch)       # the parse and the ordering, before the lock where other writers wait
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TuneCacheError(f"cannot create the autotune cache folder {self.folder}: {e.strerror or e}",
                                 hint="point TESSERA_CACHE_DIR at a writable folder") from None
        try:
            with self._locked(path):
                existing = self._load(path, arch, locked=True)
                merged, changed = existing.merged(incoming, supersede)
                if changed:
                    remove_stale_temps(path)
                    written = write_atomically(path, document_json(merged.records, merged.kept))
                    remember(FileStamp.of(path, written), merged)
                return changed
        except OSError as e:
            raise TuneCacheError(f"cannot write the autotune cache {path}: {e.strerror or e}",
                                 hint="point TESSERA_CACHE_DIR at a writable folder") from None

    def clear(self, arch: ArchSpec | str | None = None) -> int:
        """Delete this cache's records (of one arch when given); how many there were.
        Files set aside as corrupt are kept for inspection, and a file a newer tessera_rw wrote is
        left as it is, with a warning."""
        removed = 0
        for a in ([arch_name(arch)] if arch is not None else self.archs()):
            path = self.path(a)
            if not path.exists():
                continue
            try:
                with self._locked(path):
                    try:
                        found = self._load(path, a, locked=True)
                    except NewerFileError as e:
                        warn_at_user_line(TuneCacheWarning(f"{e.detail}, nor cleared"))
                        continue
                    removed += len(found.records) + len(found.kept)
                    path.unlink(missing_ok=True)
                    remove_stale_temps(path)
            except OSError as e:
                raise TuneCacheError(f"cannot clear the autotune cache {path}: {e.strerror or e}") from None
        return removed

    # ---- moving records between machines ----

    def export(self, path: str | os.PathLike[str]) -> int:
        """Write every record of this cache, all archs, to one JSON document; how many."""
        records = self.records()
        target = Path(path)
        try:
            write_atomically(target, document_json(records, name=self.name))
        except OSError as e:
            raise TuneCacheError(f"cannot write {target}: {e.strerror or e}") from None
        return len(records)

    def import_(self, path: str | os.PathLike[str]) -> int:
        """Merge the records of an export (or of a cache file) into this cache; how many were
        added or replaced a worse one. The whole file is validated first: one bad record and
        nothing is imported."""
        source = Path(path)
        data = _read_export(source)
        try:
            doc = TuneDocument.model_validate_json(data)
        except ValidationError as e:
            if (tag := newer_format(data)) is not None:
                raise TuneCacheError(f"{source} is an autotune export in the format {tag}, newer than this "
                                     f"tessera_rw's {SCHEMA}; nothing was imported",
                                     hint="upgrade tessera_rw here to import it") from None
            raise TuneCacheError(f"{source} is not a valid autotune export: {first_problem(e)}",
                                 hint="nothing was imported; export it again with `tessera-rewrite cache export`")
        changed = 0
        for arch in sorted({r.arch for r in doc.records}):
            changed += self._merge_into(arch, [r for r in doc.records if r.arch == arch])
        return changed

    @contextmanager
    def _locked(self, path: Path):
        lock = FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S)
        try:
            lock.acquire()
        except Timeout:
            raise TuneCacheError(f"the autotune cache {path} stayed locked for {LOCK_TIMEOUT_S:.0f} s",
                                 hint="another tessera_rw process is writing it; retry when it is done") from None
        try:
            yield
        finally:
            lock.release()


def _check_own_name(arch: ArchSpec | str) -> None:
    if not isinstance(arch, ArchSpec):
        return
    try:
        known = arch_named(arch.name)
    except ArchError:
        return
    if known != arch:
        differ = [f for f in type(arch).model_fields if getattr(arch, f) != getattr(known, f)]
        raise TuneCacheError(f"ArchSpec {arch.name!r} differs from the known {known.name} ({', '.join(differ)}): its "
                             f"autotune records would be taken for that GPU's",
                             hint=f"give a described GPU a name of its own: "
                                  f"spec.model_copy(update={{'name': '{known.name}-custom'}})")


def _same_spec(r: TuneRecord, arch: ArchSpec | str) -> bool:
    """A name matches its file already; an ArchSpec must also agree on the compute capability."""
    return not isinstance(arch, ArchSpec) or tuple(arch.compute_capability) == r.compute_capability


def _read_export(source: Path) -> bytes:
    """The bytes of an export: a regular file once links are followed (a device or a pipe has no
    end, whatever its size says), of at most MAX_IMPORT_BYTES."""
    try:
        # O_NONBLOCK: opening a pipe must not wait for a writer before it can be refused.
        with open(os.open(source, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise TuneCacheError(f"{source} is not a regular file; nothing was imported",
                                     hint="import a file written by `tessera-rewrite cache export`")
            data = b"" if st.st_size > MAX_IMPORT_BYTES else f.read(MAX_IMPORT_BYTES + 1)
    except OSError as e:
        raise TuneCacheError(f"cannot read {source}: {e.strerror or e}") from None
    if st.st_size > MAX_IMPORT_BYTES or len(data) > MAX_IMPORT_BYTES:   # /proc files say 0 bytes
        size = f"{st.st_size / 2**20:.1f} MiB" if st.st_size > MAX_IMPORT_BYTES else "longer than its size says"
        raise TuneCacheError(f"{source} ({size}) is over the import limit of {_import_limit()}, more than an "
                             "autotune export can be; nothing was imported",
                             hint="import a file written by `tessera-rewrite cache export`")
    return data


def _import_limit() -> str:
    """MAX_IMPORT_BYTES in words: '64 MiB (an export of about 134,000 records)'."""
    size = f"{MAX_IMPORT_BYTES >> 20} MiB" if MAX_IMPORT_BYTES >= 1 << 20 else f"{MAX_IMPORT_BYTES} bytes"
    records = MAX_IMPORT_BYTES // RECORD_BYTES
    return f"{size} (an export of about {round(records, -3) if records >= 10_000 else records:,} records)"
