"""One arch file of the autotune cache as read: its usable records, indexed for lookups, and the
records this version cannot use, kept as they were so that a rewrite never drops them.

- Trust is per record. A newer tessera_rw may write a record this one cannot read (a dtype it
  does not know); that record is skipped, with one warning, and written back unchanged, while the
  file's other records stay in use. Only bytes that are not JSON, or a top level that is not
  `{"schema": "tessera_rw.autotune/1", "records": [...]}`, condemn the whole file.
- A validated file is remembered per process under its `FileStamp`, as `fstat` of the open file
  reports it, and so is a file this process wrote: validating costs ~25 µs a record, a tuning run
  looks the cache up once per kernel, and a writer reads the file under the lock before each
  write. Every write is an `os.replace` of a new file, so a new version has a new stamp and an old
  one is never answered from memory; a file that changed is validated again, all of it.
- A write places each incoming record by bisection into the held ones (`ArchFile.merged`), and
  the new document is serialised in one call (`document_json`).

>>> from tessera_rw.tune.records import TuneDocument, TuneRecord
>>> r = TuneRecord.create(op_name="matmul", signature_hash="9f2c", shapes=((8, 8), (8, 8)), dtypes=("f32", "f32"),
...                       arch="H100-SXM", config={"bm": 64}, time_us=1.0, chosen_by="on_device")
>>> text = TuneDocument.of([r]).to_json(kept=['{"op_name": "from a newer version"}'])
>>> found = parse_arch_file(text.encode(), "H100-SXM")
>>> found.records == (r,), len(found.kept), found.skipped.split(" (")[0]
(True, 1, '1 record skipped')
>>> found.exact("matmul", "9f2c", ((8, 8), (8, 8)), ("float32", "float32")) == (r,)
True
>>> parse_arch_file(b"{not json", "H100-SXM").split(" (")[0]       # the whole file: set aside
'does not validate'
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal, NamedTuple

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from tessera_rw.tune.records import SCHEMA, FileToken, TuneDocument, TuneRecord, Versions

Shapes = tuple[tuple[int, ...], ...]


def record_order(r: TuneRecord) -> tuple:
    """The stable order records are kept and listed in."""
    return r.arch, r.identity      # identity: op, signature, shapes, dtypes, arch, compute capability, versions


def merge_records(records: Iterable[TuneRecord]) -> list[TuneRecord]:
    """The best record per key (see `TuneRecord.better_than`), in a stable order; earlier ones win ties."""
    return sorted(_keep_best({}, records).values(), key=record_order)


def _keep_best(best: dict[tuple, TuneRecord], records: Iterable[TuneRecord]) -> dict[tuple, TuneRecord]:
    """`best` (by `TuneRecord.identity`) with each of `records` put in where it beats the one held."""
    for r in records:
        identity = r.identity
        held = best.get(identity)
        if held is None or r.better_than(held):
            best[identity] = r
    return best


def _place(records: Sequence[TuneRecord], r: TuneRecord) -> tuple[int, TuneRecord | None]:
    """Where `r` goes in `records` (in `record_order`, one per key), and the record of its key held
    there, if any."""
    order = record_order(r)
    at = bisect_left(records, order, key=record_order)
    held = records[at] if at < len(records) and record_order(records[at]) == order else None
    return at, held


def first_problem(error: ValidationError, at: tuple[str | int, ...] = ()) -> str:
    """'records.3.config.bm: Input should be a valid integer (and 2 more problems)'; `at` is where
    the validated value sits in its document."""
    problems = error.errors(include_url=False, include_input=False)
    # A wrong or missing schema tag explains everything else that is wrong, so it goes first.
    head = min(problems, key=lambda p: tuple(p["loc"][:1]) != ("schema",))
    where = ".".join(str(part) for part in (*at, *head["loc"]))
    more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
    return f"{where + ': ' if where else ''}{head['msg']}{more}"


@dataclass(frozen=True)
class ArchFile:
    """What one arch file holds: the records lookups use (in file order), the raw JSON of those they
    cannot use, and why those were skipped (None when none were). Its indexes are built on first use."""
    records: tuple[TuneRecord, ...] = ()
    kept: tuple[str, ...] = ()
    skipped: str | None = None

    def exact(self, op_name: str, signature_hash: str, shapes: Shapes, dtypes: tuple[str, ...]
              ) -> tuple[TuneRecord, ...]:
        """The records of exactly this kernel (any versions, any compute capability), in `record_order`:
        `get` takes the first that fits."""
        return self._by_kernel.get((op_name, signature_hash, shapes, dtypes), ())

    def sources(self, op_name: str, dtypes: tuple[str, ...], versions: Versions, ranks: tuple[int, ...]
                ) -> tuple[TuneRecord, ...]:
        """The real (not interpolated) records of `op_name` on these dtypes and versions whose operands
        have these ranks, any signature, in no particular order: what `nearest` may start from."""
        held = self._by_source.get((op_name, dtypes, versions[:2], ranks), ())
        return tuple(r for r in held if r.holds_under(versions))

    def merged(self, incoming: Sequence[TuneRecord], supersede: bool = False) -> tuple[ArchFile, int]:
        """This file with `incoming` merged in as `merge_records` merges (with `supersede`, they first
        drop the held records of their keys), and how many of them were added or won. The skipped
        records stay as they were. Each incoming record is placed by bisection into the held ones,
        kept in `record_order`, so a write costs no pass over them in Python."""
        records = list(self._held)
        if supersede:
            for r in incoming:
                at, held = _place(records, r)
                if held is not None:
                    del records[at]
        for r in incoming:
            at, held = _place(records, r)
            if held is None:
                records.insert(at, r)
            elif r.better_than(held):
                records[at] = r
        changed = sum(1 for r in incoming if _place(records, r)[1] is r)
        if not changed:
            return self, 0
        merged = ArchFile(tuple(records), self.kept, self.skipped)
        merged.__dict__["_held"] = merged.records     # already one per key, in order: nothing to build
        return merged, changed

    @cached_property
    def _held(self) -> Sequence[TuneRecord]:
        """The records, the best one per key, in `record_order`: what a write merges into."""
        return merge_records(self.records)

    @cached_property
    def _by_kernel(self) -> dict[tuple, tuple[TuneRecord, ...]]:
        groups = _grouped(self.records, lambda r: (r.op_name, r.signature_hash, r.shapes, r.dtypes))
        # a kernel has one record per versions and GPU: sorting each group costs nothing like sorting all
        return {k: v if len(v) == 1 else tuple(sorted(v, key=record_order)) for k, v in groups.items()}

    @cached_property
    def _by_source(self) -> dict[tuple, tuple[TuneRecord, ...]]:
        return _grouped((r for r in self.records if not r.interpolated),
                        lambda r: (r.op_name, r.dtypes, r.versions[:2], ranks_of(r.shapes)))  # tessera, codegen


EMPTY = ArchFile()


def ranks_of(shapes: Shapes) -> tuple[int, ...]:
    """((4, 8), (8,)) -> (2, 1)."""
    return tuple(len(s) for s in shapes)


def _grouped(records: Iterable[TuneRecord], key) -> dict[tuple, tuple[TuneRecord, ...]]:
    groups: dict[tuple, list[TuneRecord]] = defaultdict(list)
    for r in records:
        groups[key(r)].append(r)
    return {k: tuple(v) for k, v in groups.items()}


class _Outline(BaseModel):
    """A cache file's top level, its records not yet validated."""
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    schema_tag: Literal["tessera_rw.autotune/1"] = Field(alias="schema")
    name: FileToken | None = None
    records: tuple[JsonValue, ...] = ()


class NewerFile(str):
    """A file in a later format (another tessera_rw's, sharing the cache folder): this version
    neither reads it nor moves it aside, and leaves it as it is."""


class _Tag(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    schema_tag: str = Field(alias="schema")


def newer_format(data: bytes) -> str | None:
    """The file's schema tag where it names a later version of this format, else None."""
    try:
        tag = _Tag.model_validate_json(data).schema_tag
    except ValidationError:
        return None
    prefix, _, version = tag.rpartition("/")
    ours = SCHEMA.rpartition("/")
    return tag if prefix == ours[0] and version.isdigit() and int(version) > int(ours[2]) else None


def parse_arch_file(data: bytes, arch: str) -> ArchFile | str:
    """The records of the file of `arch`, or why the whole file cannot be trusted (a NewerFile when
    a later version wrote it)."""
    try:
        doc = TuneDocument.model_validate_json(data)
    except ValidationError as whole:
        if (tag := newer_format(data)) is not None:
            return NewerFile(f"is in the format {tag}, newer than this tessera_rw's {SCHEMA}")
        return _parse_record_by_record(data, arch, whole)
    if all(r.arch == arch for r in doc.records):       # the usual case: one pass, nothing skipped
        return ArchFile(doc.records)
    return _parse_record_by_record(data, arch, None)


def _parse_record_by_record(data: bytes, arch: str, whole: ValidationError | None) -> ArchFile | str:
    try:
        outline = _Outline.model_validate_json(data)
    except ValidationError as e:
        return f"does not validate ({first_problem(whole or e)})"
    usable, kept, why = [], [], []
    for i, raw in enumerate(outline.records):
        text = pydantic_core.to_json(raw).decode()
        try:
            record = TuneRecord.model_validate_json(text)    # JSON mode, as a whole file is validated
        except ValidationError as e:
            kept.append(text)
            why.append(first_problem(e, at=("records", i)))
            continue
        if record.arch != arch:
            kept.append(text)
            why.append(f"records.{i} is for arch {record.arch}, not {arch}")
        else:
            usable.append(record)
    return ArchFile(tuple(usable), tuple(kept), _skipped_note(why))


def _skipped_note(why: list[str]) -> str | None:
    if not why:
        return None
    more = f"; and {len(why) - 1} more" if len(why) > 1 else ""
    return f"{len(why)} record{'s' if len(why) > 1 else ''} skipped ({why[0]}{more})"


class FileStamp(NamedTuple):
    """A file's version: a replaced file has a new inode, an edited one a new mtime or size."""
    path: str
    mtime_ns: int
    size: int
    inode: int

    @classmethod
    def of(cls, path: Path, st: os.stat_result) -> FileStamp:
        return cls(str(path), st.st_mtime_ns, st.st_size, st.st_ino)


_remembered: dict[str, tuple[FileStamp, ArchFile]] = {}


def read_arch_file(path: Path, arch: str) -> ArchFile | str:
    """The file of `arch` (see `parse_arch_file`), from memory when it has not changed since it was
    last validated or written. Raises OSError, FileNotFoundError when there is no file."""
    with open(path, "rb") as f:
        stamp = FileStamp.of(path, os.fstat(f.fileno()))     # of the file read, even if replaced since
        known = _remembered.get(stamp.path)
        if known is not None and known[0] == stamp:
            return known[1]
        data = f.read()
    found = parse_arch_file(data, arch)
    if isinstance(found, ArchFile):
        remember(stamp, found)
    return found


def read_ahead(path: Path, arch: str) -> None:
    """Validate the file of `arch` and order its records for a merge before a writer takes the lock,
    so that under the lock a file unchanged since costs neither. Any problem is left for the read
    under the lock to report."""
    try:
        found = read_arch_file(path, arch)
    except OSError:
        return
    if isinstance(found, ArchFile):
        found._held     # built now and kept with the remembered file


def remember(stamp: FileStamp, found: ArchFile) -> None:
    """Keep `found` as what the file of `stamp` holds (a writer knows what it just wrote)."""
    _remembered[stamp.path] = (stamp, found)
