"""The persistent autotune cache: tuning results kept across processes, safe under crashes and races.

One JSON document per (cache name, arch) at `<root>/<name>/<arch>.json`, root being
`$TESSERA_CACHE_DIR/autotune` else `~/.tessera/autotune`. Why each rule holds:

- Writers take a file lock, re-read the file and merge, so records another process wrote in the
  meantime are never lost; the new document goes to a temp file in the same folder, is fsynced,
  then `os.replace`d over the old one, so a reader or a crash only ever sees a whole file.
- Readers validate every record (pydantic, `TuneDocument`); nothing is unpickled or evaluated. A
  file that does not validate, or holds a record of another arch than its name says, is moved aside
  to `<file>.corrupt-<timestamp>` with a TuneCacheWarning and counts as empty: a bad file costs a
  re-tune, never a crash and never a wrong schedule.
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
import tempfile
import warnings
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock, Timeout
from pydantic import ValidationError

from tessera_rw.algebra.errors import TesseraError
from tessera_rw.codegen.arch import ArchSpec
from tessera_rw.codegen.binary_cache import cache_root
from tessera_rw.tune.records import (
    FILE_NAME_PATTERN, ChosenBy, TuneDocument, TuneRecord, arch_name, canonical_dtypes, canonical_shapes,
    current_versions)

LOCK_TIMEOUT_S = 60.0            # a write holds the lock for milliseconds; a minute means something is stuck
MAX_IMPORT_BYTES = 64 << 20      # ~100k records; anything bigger is not an export of ours
_NAME = re.compile(FILE_NAME_PATTERN)


class TuneCacheWarning(UserWarning):
    """A cache file was unreadable or invalid and has been moved aside; its records are ignored."""


class TuneCacheError(TesseraError):
    """A cache that cannot be written, or a file that cannot be imported."""


def merge_records(records: Iterable[TuneRecord]) -> list[TuneRecord]:
    """The best record per key (see `TuneRecord.better_than`), in a stable order; earlier ones win ties."""
    best: dict[str, TuneRecord] = {}
    for r in records:
        old = best.get(r.key)
        if old is None or r.better_than(old):
            best[r.key] = r
    return sorted(best.values(), key=_order)


def _order(r: TuneRecord) -> tuple:
    return r.arch, r.op_name, r.signature_hash, r.shapes, r.dtypes, r.key


def first_problem(error: ValidationError) -> str:
    """'records.3.config.bm: Input should be a valid integer (and 2 more problems)'."""
    problems = error.errors(include_url=False, include_input=False)
    # A wrong or missing schema tag explains everything else that is wrong, so it goes first.
    head = min(problems, key=lambda p: tuple(p["loc"][:1]) != ("schema",))
    where = ".".join(str(part) for part in head["loc"])
    more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
    return f"{where + ': ' if where else ''}{head['msg']}{more}"


def _parse(data: bytes, arch: str) -> tuple[tuple[TuneRecord, ...], str | None]:
    """The records of one arch file, or why the file cannot be trusted."""
    try:
        doc = TuneDocument.model_validate_json(data)
    except ValidationError as e:
        return (), f"does not validate ({first_problem(e)})"
    strangers = sorted({r.arch for r in doc.records} - {arch})
    if strangers:
        return (), f"holds records for arch {', '.join(strangers)}, not {arch}"
    return doc.records, None


def _log2_distance(a: tuple[tuple[int, ...], ...], b: tuple[tuple[int, ...], ...]) -> float:
    """Sum over dims of |log2(a/b)|: 64 vs 128 is as far as 4096 vs 8192. Empty dims count as 1."""
    return sum(abs(math.log2(max(x, 1) / max(y, 1))) for sa, sb in zip(a, b) for x, y in zip(sa, sb))


def _same_ranks(a: tuple[tuple[int, ...], ...], b: tuple[tuple[int, ...], ...]) -> bool:
    return len(a) == len(b) and all(len(x) == len(y) for x, y in zip(a, b))


class TuneCache:
    """The records of one named cache, one file per arch, shared by every process on the machine.
    A `read_only` one reads the same records and writes none (what explaining a program uses)."""

    def __init__(self, name: str = "default", root: str | os.PathLike[str] | None = None, *,
                 read_only: bool = False):
        if not _NAME.fullmatch(name):
            raise TuneCacheError(f"autotune cache name {name!r} is not a plain file name",
                                 hint="use letters, digits, '.', '_' or '-', starting with a letter or digit")
        self.name = name
        self.root = Path(root).expanduser() if root is not None else cache_root() / "autotune"
        self.folder = self.root / name
        self.read_only = read_only

    def __repr__(self) -> str:
        return f"TuneCache({self.name!r}, root={str(self.root)!r})"

    def path(self, arch: ArchSpec | str) -> Path:
        """The file that holds this cache's records for `arch`."""
        name = arch_name(arch)
        if not _NAME.fullmatch(name):
            raise TuneCacheError(f"arch name {name!r} cannot name a cache file",
                                 hint="give the ArchSpec a name of letters, digits, '.', '_' or '-'")
        return self.folder / f"{name}.json"

    def archs(self) -> list[str]:
        """The archs this cache holds a file for."""
        if not self.folder.is_dir():
            return []
        return sorted(p.stem for p in self.folder.glob("*.json") if _NAME.fullmatch(p.stem))

    # ---- reading ----

    def records(self, arch: ArchSpec | str | None = None) -> list[TuneRecord]:
        """Every record of this cache (of one arch when given), in a stable order."""
        archs = [arch_name(arch)] if arch is not None else self.archs()
        return sorted((r for a in archs for r in self._load(self.path(a), a)), key=_order)

    def get(self, op_name: str, signature_hash: str, shapes: Sequence[Sequence[int]], dtypes: Sequence[object],
            arch: ArchSpec | str) -> TuneRecord | None:
        """The record for exactly this kernel on `arch` under this process's versions, else None.

        >>> TuneCache(root=tempfile.mkdtemp()).get("matmul", "9f2c", [(8, 8)], ["f32"], "h100") is None
        True
        """
        shapes, dtypes, versions = canonical_shapes(shapes), canonical_dtypes(dtypes), current_versions()
        for r in self.records(arch):
            if (r.op_name, r.signature_hash, r.shapes, r.dtypes, r.versions) == (
                    op_name, signature_hash, shapes, dtypes, versions) and _same_spec(r, arch):
                return r
        return None

    def nearest(self, op_name: str, shapes: Sequence[Sequence[int]], dtypes: Sequence[object],
                arch: ArchSpec | str, *, signature_hash: str | None = None) -> TuneRecord | None:
        """For a shape never tuned: the record of the same op, dtypes, arch and versions (and signature,
        when given) whose operand shapes of the same ranks are nearest in log2 space, as a copy
        marked `interpolated=True` (its shapes and time are the source's). None when there is none.
        Interpolated records are never a source, so guesses do not compound.

        >>> TuneCache(root=tempfile.mkdtemp()).nearest("matmul", [(8, 8)], ["f32"], "h100") is None
        True
        """
        shapes, dtypes, versions = canonical_shapes(shapes), canonical_dtypes(dtypes), current_versions()
        sources = [r for r in self.records(arch)
                   if r.op_name == op_name and r.dtypes == dtypes and r.versions == versions and not r.interpolated
                   and signature_hash in (None, r.signature_hash) and _same_ranks(r.shapes, shapes)
                   and _same_spec(r, arch)]
        if not sources:
            return None
        best = min(sources, key=lambda r: (_log2_distance(r.shapes, shapes), r.chosen_by is not ChosenBy.ON_DEVICE,
                                           r.time_us, r.key))
        return best.model_copy(update={"interpolated": True})

    def _load(self, path: Path, arch: str, *, locked: bool = False) -> tuple[TuneRecord, ...]:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return ()
        except OSError as e:
            warnings.warn(f"autotune cache file {path} cannot be read ({e.strerror}); ignored", TuneCacheWarning,
                          stacklevel=3)
            return ()
        records, problem = _parse(data, arch)
        if problem is None:
            return records
        if not locked:
            # Look again under the lock: a writer may have replaced the file since, and only the
            # bad file itself may be moved aside, never the good one that replaced it.
            try:
                with self._locked(path):
                    return self._load(path, arch, locked=True)
            except (OSError, TuneCacheError) as e:     # a reader never fails on a bad file: it skips it
                reason = e.strerror if isinstance(e, OSError) else str(e).splitlines()[0]
                warnings.warn(f"autotune cache file {path} {problem}; ignored (could not move it aside: "
                              f"{reason})", TuneCacheWarning, stacklevel=3)
                return ()
        aside = _set_aside(path)
        warnings.warn(f"autotune cache file {path} {problem}; moved aside to {aside.name} and ignored",
                      TuneCacheWarning, stacklevel=4)
        return ()

    # ---- writing ----

    def put(self, record: TuneRecord) -> bool:
        """Merge `record` into the file of its arch; True when it was added or replaced a worse one
        (never, for a read-only cache)."""
        return self._merge_into(record.arch, [record]) > 0

    def _merge_into(self, arch: str, incoming: Sequence[TuneRecord]) -> int:
        """Merge records of one arch into its file under the lock; how many were added or won."""
        if self.read_only:
            return 0
        path = self.path(arch)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with self._locked(path):
                existing = self._load(path, arch, locked=True)
                merged = merge_records([*existing, *incoming])
                kept = set(map(id, merged))
                changed = sum(1 for r in incoming if id(r) in kept)
                if changed:
                    _remove_stale_temps(path)
                    _write_atomically(path, TuneDocument.of(merged).to_json().encode())
                return changed
        except OSError as e:
            raise TuneCacheError(f"cannot write the autotune cache {path}: {e.strerror or e}",
                                 hint="point TESSERA_CACHE_DIR at a writable folder") from None

    def clear(self, arch: ArchSpec | str | None = None) -> int:
        """Delete this cache's records (of one arch when given); how many there were.
        Files set aside as corrupt are kept for inspection."""
        removed = 0
        for a in ([arch_name(arch)] if arch is not None else self.archs()):
            path = self.path(a)
            if not path.exists():
                continue
            try:
                with self._locked(path):
                    removed += len(self._load(path, a, locked=True))
                    path.unlink(missing_ok=True)
                    _remove_stale_temps(path)
            except OSError as e:
                raise TuneCacheError(f"cannot clear the autotune cache {path}: {e.strerror or e}") from None
        return removed

    # ---- moving records between machines ----

    def export(self, path: str | os.PathLike[str]) -> int:
        """Write every record of this cache, all archs, to one JSON document; how many."""
        records = self.records()
        target = Path(path)
        try:
            _write_atomically(target, TuneDocument.of(records, name=self.name).to_json().encode())
        except OSError as e:
            raise TuneCacheError(f"cannot write {target}: {e.strerror or e}") from None
        return len(records)

    def import_(self, path: str | os.PathLike[str]) -> int:
        """Merge the records of an export (or of a cache file) into this cache; how many were
        added or replaced a worse one. The whole file is validated first: one bad record and
        nothing is imported."""
        source = Path(path)
        try:
            size = source.stat().st_size
            if size > MAX_IMPORT_BYTES:
                raise TuneCacheError(f"{source} is {size >> 20} MiB, more than an autotune export can be "
                                     f"({MAX_IMPORT_BYTES >> 20} MiB); nothing was imported")
            data = source.read_bytes()
        except OSError as e:
            raise TuneCacheError(f"cannot read {source}: {e.strerror or e}") from None
        try:
            doc = TuneDocument.model_validate_json(data)
        except ValidationError as e:
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


def _same_spec(r: TuneRecord, arch: ArchSpec | str) -> bool:
    """A name matches its file already; an ArchSpec must also agree on the compute capability."""
    return not isinstance(arch, ArchSpec) or tuple(arch.compute_capability) == r.compute_capability


def _write_atomically(path: Path, data: bytes) -> None:
    """Temp file in the same folder (so `os.replace` is a rename), fsync, replace, fsync the folder."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, 0o644)   # mkstemp's 0600 would hide a shared cache from other users
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    try:
        folder = os.open(path.parent, os.O_RDONLY)
    except OSError:   # a folder that cannot be opened cannot be fsynced either; the rename stands
        return
    try:
        os.fsync(folder)
    except OSError:
        pass
    finally:
        os.close(folder)


def _remove_stale_temps(path: Path) -> None:
    """Temp files a killed writer left behind. Only called under the file's lock, so no live
    writer of this file can own one."""
    for temp in path.parent.glob(f".{path.name}.*.tmp"):
        temp.unlink(missing_ok=True)


def _set_aside(path: Path) -> Path:
    """Rename a bad file to `<file>.corrupt-<UTC timestamp>` so it can be inspected, not reused."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while aside.exists():
        aside, n = path.with_name(f"{path.name}.corrupt-{stamp}-{n}"), n + 1
    os.replace(path, aside)
    return aside
