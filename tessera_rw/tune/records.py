"""One autotuning result: which schedule won for one kernel on one GPU, and under which software.

A record is data read back from disk that anyone could have written, so every field is typed
tightly: names are short plain tokens (never code, never a dunder), numbers are finite, a config
is a flat map of small scalars. Anything else fails validation; nothing is ever evaluated or
unpickled. The `key` is everything that can change which schedule is fastest: the op and its
signature, shapes, dtypes, the GPU, and the tessera_rw, codegen, NVRTC and driver versions. A
cost-model record holds under any NVRTC and driver, as an estimate involves neither: a cache
tuned with `--arch` on a machine without a GPU serves that GPU's machines.

>>> r = TuneRecord.create(op_name="matmul", signature_hash="9f2c", shapes=((128, 64), (64, 256)),
...                       dtypes=("bf16", "bf16"), arch="H100-SXM", config={"bm": 128, "bn": 128},
...                       time_us=12.5, chosen_by=ChosenBy.ON_DEVICE)
>>> r.dtypes, r.compute_capability
(('bfloat16', 'bfloat16'), (9, 0))
>>> TuneRecord.model_validate_json(r.model_dump_json()) == r
True
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import re
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from functools import cache, lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import (AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, PlainValidator, StrictBool,
                      StrictFloat, StrictInt, StrictStr, StringConstraints, TypeAdapter, ValidationError,
                      field_validator, model_validator)
from pydantic.types import FailFast
from pydantic_core import InitErrorDetails, PydanticCustomError

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.codegen.arch import ArchError, ArchSpec, arch_named
from tessera_rw.codegen.binary_cache import CODEGEN_VERSION
from tessera_rw.support.version import package_version

SCHEMA = "tessera_rw.autotune/1"      # the document format; bump with TuneRecord.schema_version

# An arch or cache name becomes a file or folder name: no separators, no leading dot.
FILE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
FileToken = Annotated[str, StringConstraints(pattern=FILE_NAME_PATTERN)]
# Op names, versions, hashes and config strings: short printable tokens that start with a letter or digit.
TOKEN_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.:+/\-]{0,127}"
Token = Annotated[str, StringConstraints(pattern=f"^{TOKEN_PATTERN}$")]
Finite = Annotated[StrictFloat, Field(allow_inf_nan=False)]
Count = Annotated[StrictInt, Field(ge=0, le=2**62)]
_TOKEN = re.compile(TOKEN_PATTERN)
_CONFIG_KEY = re.compile(r"[a-z][a-z0-9_]{0,63}")
_CONFIG_LIST_MAX = 64
_compact_json = json.JSONEncoder(separators=(",", ":")).encode


def _config_key(key: str) -> str:
    if not _CONFIG_KEY.fullmatch(key):
        raise ValueError(f"config keys are lower-case names such as 'bm' or 'fusion_depth', not {key[:40]!r}")
    return key


def _config_scalar(value: object) -> bool | int | float | str:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and abs(value) <= 2**62:
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, str) and _TOKEN.fullmatch(value):
        return value
    if isinstance(value, int):
        shown = "an integer beyond 2**62"          # never str() it: a huge int is slow to print
    else:
        shown = repr(value)[:40] if isinstance(value, (float, str)) else type(value).__name__
    raise ValueError(f"config values are booleans, integers, finite numbers, short names ({TOKEN_PATTERN}) "
                     f"or flat lists of them, not {shown}")


def _config_value(value: object) -> object:
    """One clear error for a bad config value, where a union type would list one per member."""
    if isinstance(value, (list, tuple)):
        if len(value) > _CONFIG_LIST_MAX:
            raise ValueError(f"a config list has at most {_CONFIG_LIST_MAX} items, not {len(value)}")
        return [_config_scalar(v) for v in value]
    return _config_scalar(value)


def _config(config: dict[str, object]) -> dict[str, object]:
    """A whole config checked in one call rather than one per key and value (a cache file holds tens
    of thousands of configs); each problem is reported where a per-item validator would put it.

    >>> _config({"bm": 64, "order": ("m", "n")})
    {'bm': 64, 'order': ['m', 'n']}
    """
    clean: dict[str, object] = {}
    problems: list[InitErrorDetails] = []
    for key, value in config.items():
        try:
            _config_key(key)
        except ValueError as e:
            problems.append(_value_error(e, at=(key, "[key]"), given=key))
        try:
            clean[key] = _config_value(value)
        except ValueError as e:
            problems.append(_value_error(e, at=(key,), given=value))
    if problems:
        raise ValidationError.from_exception_data("config", problems)
    return clean


def _value_error(error: ValueError, at: tuple[str, ...], given: object) -> InitErrorDetails:
    """`error` as pydantic reports a ValueError raised at `at`."""
    return {"type": PydanticCustomError("value_error", "Value error, {reason}", {"reason": str(error)}),
            "loc": at, "input": given}


ConfigKey = Annotated[StrictStr, AfterValidator(_config_key)]
ConfigValue = Annotated[Any, PlainValidator(_config_value)]
Config = Annotated[dict[StrictStr, Any], Field(max_length=64), AfterValidator(_config)]
Dim = Annotated[StrictInt, Field(ge=0, le=2**62)]
# FailFast on every sequence a file can make long: validation stops at the first bad item, where it
# would otherwise report each of millions.
Shape = Annotated[tuple[Dim, ...], Field(max_length=16), FailFast()]
Micros = Annotated[Finite, Field(ge=0)]


class ChosenBy(enum.StrEnum):
    """How a config or a program was picked: timed on the GPU, ranked by the cost model alone, read
    from the cache or from its nearest tuned shape, pinned by the user's tile_shape, or replayed from
    a timing log. A record holds one of the first two."""
    ON_DEVICE = "on_device"
    COST_MODEL = "cost_model"
    CACHE = "cache"
    INTERPOLATED = "interpolated"
    PINNED = "pinned"
    REPLAY = "replay"


def _measured(by: ChosenBy) -> ChosenBy:
    if by not in (ChosenBy.ON_DEVICE, ChosenBy.COST_MODEL):
        raise ValueError(f"a record's config is timed on the device or ranked by the cost model, not {by.value!r}")
    return by


class Versions(NamedTuple):
    """The software a tuning result holds for; a record of any other versions is never a hit."""
    tessera: str
    codegen: str
    nvrtc: str
    driver: str


@cache
def nvrtc_version() -> str:
    """NVRTC's 'major.minor', or 'unknown' where cuda-python or NVRTC cannot be loaded."""
    try:
        from cuda.bindings import nvrtc
        result, major, minor = nvrtc.nvrtcVersion()
    except Exception:  # no cuda-python, no libnvrtc: still usable for cost-model records
        return "unknown"
    return f"{major}.{minor}" if result == nvrtc.nvrtcResult.NVRTC_SUCCESS else "unknown"


@cache
def driver_version() -> str:
    """The CUDA driver's 'major.minor' (12040 -> '12.4'), or 'none' on a machine without one."""
    try:
        from cuda.bindings import driver
        result, version = driver.cuDriverGetVersion()
    except Exception:  # libcuda absent: a CPU-only machine
        return "none"
    if result != driver.CUresult.CUDA_SUCCESS:
        return "none"
    return f"{version // 1000}.{version % 1000 // 10}"


# The sources whose text decides a tuned kernel's generated code (paths in tessera_rw.codegen): a
# schedule timed under other kernel text may no longer be the fastest, so records made before a
# change to any of them must be misses.
CODEGEN_SOURCES = ("templates", "prelude.py", "numerics.py", "compile.py")


def hash_sources(root: Path, names: Sequence[str] = CODEGEN_SOURCES) -> str:
    """12 hex digits of a hash of the .py files `names` name under `root` (files, or folders taken
    whole), each with its path, in sorted path order: a change of any byte, or a file added or
    removed, changes it; a touch does not."""
    digest = hashlib.sha256()
    for f in sorted(_source_files(root, names)):
        data = f.read_bytes()
        digest.update(f"{f.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:12]


def _source_files(root: Path, names: Sequence[str]) -> Iterator[Path]:
    for name in names:
        yield from [root / name] if name.endswith(".py") else (root / name).rglob("*.py")


@cache
def codegen_source_hash() -> str:
    """`hash_sources` of tessera_rw.codegen, once per process, when a record is first made or looked up."""
    return hash_sources(Path(__file__).resolve().parents[1] / "codegen")     # tessera_rw/codegen


@cache
def tessera_version() -> str:
    """`package_version()`, read once: it parses the installed metadata (~1 ms), and every lookup asks."""
    return package_version()


def current_versions() -> Versions:
    """The versions this process would record, e.g. Versions('0.1.0', 'tessera_rw-codegen-1+3fa2c81d09be',
    '13.0', 'none'): the codegen version names the kernel sources' hash too."""
    return Versions(tessera_version(), f"{CODEGEN_VERSION.decode()}+{codegen_source_hash()}", nvrtc_version(),
                    driver_version())


@lru_cache(maxsize=256)     # validating a file asks twice per record, of a handful of names
def _known_arch(name: str) -> tuple[str, tuple[int, int]] | None:
    """(canonical name, compute capability) of the known arch `name` names, else None."""
    try:
        spec = arch_named(name)
    except ArchError:
        return None
    return spec.name, tuple(spec.compute_capability)


def arch_name(arch: ArchSpec | str) -> str:
    """The canonical name records use: 'h100' -> 'H100-SXM'; a name tessera_rw does not know stays as given."""
    if isinstance(arch, ArchSpec):
        return arch.name
    known = _known_arch(arch)
    return known[0] if known else arch     # a user-described ArchSpec is known only by its own name


def canonical_dtypes(dtypes) -> tuple[str, ...]:
    """('bf16', DType.float32) -> ('bfloat16', 'float32')."""
    return tuple(DType.parse(d).value for d in dtypes)


@lru_cache(maxsize=256)    # a file holds a handful of dtype tuples, each in thousands of records
def _canonical_dtype_names(names: tuple[str, ...]) -> tuple[str, ...]:
    return canonical_dtypes(names)


def canonical_shapes(shapes) -> tuple[tuple[int, ...], ...]:
    """[[4, 8], (8,)] -> ((4, 8), (8,))."""
    return tuple(tuple(int(d) for d in s) for s in shapes)


class TuneRecord(BaseModel):
    """The schedule chosen for one kernel signature on one GPU. Frozen; `key` identifies it."""
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    op_name: Token
    signature_hash: Token = Field(description="hash of the op and its attributes (not shapes or dtypes)")
    shapes: Annotated[tuple[Shape, ...], Field(max_length=64), FailFast()] = Field(description="one per operand")
    dtypes: Annotated[tuple[Token, ...], Field(max_length=64), FailFast()] = Field(description="one per operand")
    arch: FileToken
    compute_capability: tuple[Annotated[StrictInt, Field(ge=0, le=99)], Annotated[StrictInt, Field(ge=0, le=99)]]
    tessera_version: Token
    codegen_version: Token
    nvrtc_version: Token
    driver_version: Token
    config: Config
    time_us: Micros = Field(description="median measured time, or the cost model's estimate")
    chosen_by: Annotated[ChosenBy, AfterValidator(_measured)]
    noise_us: Micros = 0.0
    trials: Count = 0
    created: AwareDatetime
    interpolated: StrictBool = False

    @field_validator("schema_version", mode="before")
    @classmethod
    def _not_a_bool(cls, value: object) -> object:
        if not (type(value) is int):   # Literal[1] alone would take true and 1.0
            raise ValueError(f"schema_version is the integer 1, not {type(value).__name__}")
        return value

    @field_validator("dtypes")
    @classmethod
    def _known_dtypes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        try:
            return _canonical_dtype_names(value)
        except TesseraError as e:
            raise ValueError(e.detail) from None

    @field_validator("arch")
    @classmethod
    def _canonical_arch(cls, value: str) -> str:
        return arch_name(value)   # 'h100' and 'H100-SXM' must land in the same file

    @model_validator(mode="after")
    def _consistent(self) -> TuneRecord:
        if len(self.shapes) != len(self.dtypes):
            raise ValueError(f"{len(self.shapes)} shapes but {len(self.dtypes)} dtypes; give one of each per operand")
        known = _known_arch(self.arch)
        if known is not None and known[1] != self.compute_capability:
            raise ValueError(f"{self.arch} has compute capability {known[1]}, not {self.compute_capability}")
        return self

    @classmethod
    def create(cls, *, op_name: str, signature_hash: str, shapes, dtypes, arch: ArchSpec | str,
               config: dict, time_us: float, chosen_by: ChosenBy | str, noise_us: float = 0.0, trials: int = 0,
               versions: Versions | None = None) -> TuneRecord:
        """A record stamped with this process's versions and the current time (see the module example).
        `arch` is an ArchSpec or the name of a known one."""
        spec = arch if isinstance(arch, ArchSpec) else arch_named(arch)
        v = versions or current_versions()
        return cls(op_name=op_name, signature_hash=signature_hash, shapes=canonical_shapes(shapes),
                   dtypes=tuple(dtypes), arch=spec.name, compute_capability=spec.compute_capability,
                   tessera_version=v.tessera, codegen_version=v.codegen, nvrtc_version=v.nvrtc,
                   driver_version=v.driver, config=config, time_us=float(time_us), chosen_by=ChosenBy(chosen_by),
                   noise_us=float(noise_us), trials=trials, created=datetime.now(timezone.utc))

    def __hash__(self) -> int:  # the config is a dict; equal records have equal keys
        return hash(self.identity)

    @property
    def versions(self) -> Versions:
        return Versions(self.tessera_version, self.codegen_version, self.nvrtc_version, self.driver_version)

    def versions_differing(self, here: Versions) -> list[str]:
        """The version fields that keep this record from answering for a process of versions `here`:
        any that differ, but NVRTC's and the driver's for a cost-model record."""
        device_free = self.chosen_by is ChosenBy.COST_MODEL
        return [field for field, theirs, ours in zip(Versions._fields, self.versions, here)
                if theirs != ours and not (device_free and field in ("nvrtc", "driver"))]

    def holds_under(self, here: Versions) -> bool:
        """Whether this record answers for a process of versions `here`."""
        return not self.versions_differing(here)

    @property
    def identity(self) -> tuple:
        """`key` as a tuple: equal exactly when the keys are, and ~10x cheaper to build (a merge
        keys every record of a file)."""
        return (self.op_name, self.signature_hash, self.shapes, self.dtypes, self.arch, self.compute_capability,
                self.tessera_version, self.codegen_version, self.nvrtc_version, self.driver_version)

    @property
    def key(self) -> str:
        """Everything that can change which schedule wins, as one stable JSON string."""
        return _compact_json(self.identity)

    def better_than(self, other: TuneRecord) -> bool:
        """Whether this record should replace `other` of the same key: a measurement beats an
        estimate, a real record beats an interpolated one, then the lower time wins (ties keep `other`)."""
        return self._rank() < other._rank()

    def _rank(self) -> tuple[bool, bool, float]:
        return self.interpolated, self.chosen_by is not ChosenBy.ON_DEVICE, self.time_us


class TuneDocument(BaseModel):
    """What a cache file or an export holds: the schema tag, then the records."""
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    schema_tag: Literal["tessera_rw.autotune/1"] = Field(alias="schema")   # required: a file says what it is
    name: FileToken | None = Field(None, description="the cache an export came from")
    records: Annotated[tuple[TuneRecord, ...], FailFast()] = ()      # a junk file is refused at its first record

    @classmethod
    def of(cls, records, name: str | None = None) -> TuneDocument:
        """The document holding `records` (an export names its cache)."""
        return cls(schema=SCHEMA, name=name, records=tuple(records))

    def to_json(self, kept: Sequence[str] = ()) -> str:
        """The document as `document_json` writes it, as text."""
        return document_json(self.records, kept, self.name).decode()


_RECORDS = TypeAdapter(tuple[TuneRecord, ...])


def document_json(records: Sequence[TuneRecord], kept: Sequence[str] = (), name: str | None = None) -> bytes:
    """The TuneDocument of `records`, one record per line, so a cache file reads and diffs line by
    line. `kept` are records this version could not read, as raw JSON, written back after the others
    unchanged. The records are serialised in one pydantic-core call, and not validated again: a
    TuneDocument built of them would run each record's model validator once more.

    >>> document_json([], kept=['{"from": "a newer version"}'])
    b'{"schema": "tessera_rw.autotune/1", "records": [\\n{"from": "a newer version"}\\n]}\\n'
    """
    head = json.dumps({"schema": SCHEMA, **({"name": name} if name else {})})[:-1].encode()
    dumped = _RECORDS.dump_json(tuple(records))[1:-1]
    # A record's JSON starts with its first field; that text cannot occur inside a JSON string (its
    # quotes would be escaped), so each match is the start of a record.
    lines = [dumped.replace(b'},{"schema_version":', b'},\n{"schema_version":')] if dumped else []
    lines += [k.encode() for k in kept]
    if not lines:
        return head + b', "records": []}\n'
    return head + b', "records": [\n' + b",\n".join(lines) + b"\n]}\n"
