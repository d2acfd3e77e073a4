"""The errors users see. Each names the op, the operands' shapes and dtypes, and the user's line.

An op's shape rule raises a bare error with only the detail ("contraction dims 3 and 4 differ");
`with_context` re-raises it with everything a user needs to find and fix the call.
"""

from __future__ import annotations


class TesseraError(Exception):
    """Base of every error tessera_rw raises on purpose."""

    def __init__(self, detail: str, *, op: str | None = None, operands: str | None = None,
                 site: str | None = None, hint: str | None = None):
        self.detail, self.op, self.operands, self.site, self.hint = detail, op, operands, site, hint
        super().__init__(self._render())

    def _render(self) -> str:
        head = f"{self.op}: {self.detail}" if self.op else self.detail
        lines = [head]
        if self.operands:
            lines.append(f"  operands: {self.operands}")
        if self.site:
            lines.append(f"  at {self.site}")
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)

    def with_context(self, *, op: str | None = None, operands: str | None = None,
                     site: str | None = None) -> TesseraError:
        """A copy of this error of the same class with the missing context filled in."""
        return type(self)(self.detail, op=self.op or op, operands=self.operands or operands,
                          site=self.site or site, hint=self.hint)


class ShapeError(TesseraError):
    """Operand shapes that do not fit the op."""


class AxisError(ShapeError):
    """An axis outside the operand's rank, or repeated."""


class DTypeError(TesseraError):
    """An unknown dtype, or one the op does not accept."""


class AttributeValueError(TesseraError):
    """An attribute (stride, padding, eps, ...) with a value the op cannot take."""


class ArgumentError(TesseraError):
    """A kernel argument that is not a tensor, or arguments that do not bind to the function."""


class ResultError(TesseraError):
    """A traced function that returned something other than tensors."""


class VerifyError(TesseraError):
    """A graph whose nodes disagree with their ops' rules (a bug in a pass, not in user code)."""


class HostFallbackWarning(UserWarning):
    """A call on a machine with a GPU that runs on the host, because some step of its plan has no
    GPU kernel; the message lists the steps."""


class RetraceWarning(UserWarning):
    """A kernel argument baked into its trace (a Python float) that keeps changing, so that each
    call traces and compiles anew; the message says how to make it an input."""
