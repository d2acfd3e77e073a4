"""Timing logs: every schedule of one kernel measured on a GPU, kept as a file, and replayed.

`python -m bench tuning-logs` records logs on a GPU (every schedule of the space, interleaved, with
its samples); a `ReplayMeasurer` answers from a log, so search strategies can be compared on real
timings on a machine without a GPU, exactly and repeatably. A log is validated data like the
cache (pydantic, nothing evaluated).

>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.algebra.node import TensorType
>>> from tessera_rw.tune.measure import Measurement
>>> t = TensorType((64, 64), DType.float32)
>>> log = TimingLog.of(KernelOp.of("exp", (t,), t), "H100-SXM", "test",
...                    [({"threads": 256, "vec": 4}, Measurement.of([3.0, 3.2])),
...                     ({"threads": 128, "vec": 4}, Measurement.failed("no"))])
>>> TimingLog.model_validate_json(log.model_dump_json()).kernel_op() == log.kernel_op()
True
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.base import Schedule
from tessera_rw.rules.schema import ATTRS, DTYPE, OPT_DTYPE
from tessera_rw.tune.measure import Measurement
from tessera_rw.tune.records import ChosenBy, ConfigKey, ConfigValue, FileToken, Finite, Shape, Token
from tessera_rw.tune.space import full_config, schedule_config

LOG_SCHEMA = "tessera_rw.timing-log/1"


class LoggedTensor(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    shape: Shape
    dtype: Token

    def tensor_type(self) -> TensorType:
        return TensorType(tuple(self.shape), DType.parse(self.dtype))


class LoggedOp(BaseModel):
    """A KernelOp as data: attributes are JSON values (tuples come back from lists)."""
    model_config = ConfigDict(frozen=True, extra="forbid")
    op: Token
    operands: tuple[LoggedTensor, ...]
    result: LoggedTensor
    attrs: dict[Token, Any]
    numerics: Token

    @staticmethod
    def of(op: KernelOp) -> LoggedOp:
        return LoggedOp(op=op.op, operands=tuple(LoggedTensor(shape=t.shape, dtype=t.dtype.value) for t in op.operands),
                        result=LoggedTensor(shape=op.result.shape, dtype=op.result.dtype.value),
                        attrs={k: v.value if isinstance(v, DType) else v for k, v in op.attrs},
                        numerics=op.numerics.value)


# attributes that hold a dtype: logged by name, parsed back
DTYPE_ATTRS = frozenset(name for name, c in ATTRS.items() if c in (DTYPE, OPT_DTYPE))


def _attr(name: str, value: Any) -> Any:
    """A logged attribute as the op has it: tuples from lists, dtypes from their names."""
    if name in DTYPE_ATTRS and value is not None:
        return DType.parse(value)
    return _tuples(value)


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


class LogEntry(BaseModel):
    """One schedule's samples in µs, or why it could not be measured."""
    model_config = ConfigDict(frozen=True, extra="forbid")
    config: Annotated[dict[ConfigKey, ConfigValue], Field(max_length=64)]
    samples_us: tuple[Finite, ...] = ()
    failure: Annotated[str, Field(max_length=2000)] | None = None

    def measurement(self) -> Measurement:
        if self.failure is not None or not self.samples_us:
            return Measurement.failed(self.failure or "no samples")
        return Measurement.of(self.samples_us)


class TimingLog(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)
    schema_tag: Literal["tessera_rw.timing-log/1"] = Field(alias="schema")
    arch: FileToken
    device: Annotated[str, Field(max_length=200)]
    recorded: AwareDatetime
    op: LoggedOp
    entries: tuple[LogEntry, ...]

    @staticmethod
    def of(op: KernelOp, arch: str, device: str, measured: Iterable[tuple[dict, Measurement]]) -> TimingLog:
        entries = tuple(LogEntry(config=c, samples_us=m.samples) if m.ok else LogEntry(config=c, failure=m.failure)
                        for c, m in measured)
        return TimingLog(schema=LOG_SCHEMA, arch=arch, device=device, recorded=datetime.now(timezone.utc),
                         op=LoggedOp.of(op), entries=entries)

    @staticmethod
    def load(path: str | Path) -> TimingLog:
        return TimingLog.model_validate_json(Path(path).read_bytes())

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.model_dump_json(by_alias=True, indent=1) + "\n")

    def kernel_op(self) -> KernelOp:
        o = self.op
        attrs = {k: _attr(k, v) for k, v in o.attrs.items()}
        return KernelOp.of(o.op, tuple(t.tensor_type() for t in o.operands), o.result.tensor_type(),
                           numerics=o.numerics, **attrs)


class ReplayMeasurer:
    """Answers measurements from a timing log; a schedule the log lacks is a failure saying so."""
    method = ChosenBy.REPLAY

    def __init__(self, log: TimingLog):
        self.log = log
        self.entries = {_key(e.config): e for e in log.entries}

    def measure(self, schedules: Sequence[Schedule]) -> list[Measurement]:
        out = []
        for s in schedules:
            entry = self.entries.get(_key(schedule_config(s))) or self.entries.get(_key(full_config(s)))
            out.append(entry.measurement() if entry is not None
                       else Measurement.failed(f"{s.describe()} is not in the timing log"))
        return out


def _key(config: dict) -> str:
    return repr(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in config.items()))
