"""What `tessera-rewrite` runs on: FILE.py[:FUNCTION] targets, their modules, and their inputs.

A target is FILE.py:FUNCTION, or FILE.py for every @op.kernel the file makes (imported ones aside).
A target module may define `example_inputs()` returning a dict of arrays or op.tensor placeholders
(one dict for all its kernels: each takes the entries its parameters name; or one dict per kernel,
keyed by the kernel's name);
`--input NAME=4x16x2048x64:bf16` gives one or overrides it (NAME may be a path into a container).

>>> parse_input("q=4x16x2048x64:bf16")
('q', tensor((4, 16, 2048, 64), bfloat16))
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import re
import sys
import traceback
from pathlib import Path
from typing import Any, Sequence

from tessera_rw.algebra.captures import function_of
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.tensor import TensorSpec
from tessera_rw.kernel import Kernel

from tessera_rw.cli.usage import UsageError


PATH_STEP = re.compile(r"\.([A-Za-z_]\w*)|\[(\d+)\]")


def parse_input(text: str) -> tuple[str, TensorSpec]:
    """'q=4x16x2048x64:bf16' -> ('q', op.tensor((4, 16, 2048, 64), 'bf16')); dtype defaults to float32.
    NAME may be a path into a container argument, as graphs name its arrays: p.w, p.layers[0].w."""
    name, eq, spec = text.partition("=")
    head = re.match(r"[A-Za-z_]\w*", name)
    if not eq or head is None or "".join(m.group(0) for m in PATH_STEP.finditer(name, head.end())) != name[head.end():]:
        raise UsageError(f"malformed --input {text!r}: expected NAME=DIMS[:DTYPE], e.g. q=4x16x2048x64:bf16 "
                         "(NAME may be a path into a dict or list argument: p.w, p.layers[0].w)")
    dims, _, dtype = spec.partition(":")
    try:
        shape = tuple(int(d) for d in dims.split("x")) if dims else ()
        return name, TensorSpec(shape, dtype or "float32")
    except (ValueError, TesseraError) as e:
        detail = e.detail if isinstance(e, TesseraError) else "dimensions must be integers joined by 'x'"
        raise UsageError(f"malformed --input {text!r}: {detail}") from None


def _import(file: Path) -> Any:
    spec = importlib.util.spec_from_file_location(file.stem, file)
    if spec is None or spec.loader is None:
        raise UsageError(f"{file} is not a Python file: give a .py file (or FILE.py:FUNCTION)")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(file.parent.resolve()))
    try:
        with contextlib.redirect_stdout(sys.stderr):     # what a module prints is not part of the report
            spec.loader.exec_module(module)
    except TesseraError:
        raise
    except Exception as e:  # the user's module failed to import: say so in one line
        raise UsageError(f"importing {file} failed: {type(e).__name__}: {e}") from None
    finally:
        sys.path.pop(0)
    return module


def load_targets(target: str) -> tuple[list[Kernel], Any]:
    """'path.py:func' -> ([func as a Kernel], module); 'path.py' -> (every @op.kernel it defines, module)."""
    path, colon, func = target.rpartition(":")
    if not colon:
        path = target
    elif not path or not func:
        raise UsageError(f"target {target!r} must be FILE.py:FUNCTION or FILE.py")
    file = Path(path)
    if file.is_dir():
        raise UsageError(f"{path} is a folder: name a .py file in it (FILE.py or FILE.py:FUNCTION)")
    if not file.is_file():
        raise UsageError(f"no such file: {path}")
    module = _import(file)
    named = {name: v for name, v in vars(module).items() if isinstance(v, Kernel) and _made_in(v, module)}
    kernels = list({id(v): v for v in named.values()}.values())
    if not colon:
        if not kernels:
            raise UsageError(f"{path} defines no @op.kernel function: name one as {path}:FUNCTION")
        return kernels, module
    fn = getattr(module, func, None)
    if fn is None:      # the name a report gives the kernel (grad_loss), not its variable's
        fn = next((k for k in kernels if k.name == func), None)
    if fn is None or not callable(fn):
        made = [f"{name} ({v.name})" if v.name != name else name for name, v in named.items()]
        raise UsageError(f"{path} has no function {func!r}"
                         + (f"; its kernels are {', '.join(made)}" if made else ""))
    if not isinstance(fn, Kernel) and _takes_nothing(fn):
        made = [f"{name} ({v.name})" if v.name != name else name for name, v in named.items()]
        raise UsageError(f"{path}:{func} takes no arguments, so it computes on no tensors: it is not a kernel"
                         + (f"; the kernels of {path} are {', '.join(made)}" if made else ""))
    return [fn if isinstance(fn, Kernel) else Kernel(fn)], module


def _takes_nothing(fn: Any) -> bool:
    try:
        return not inspect.signature(fn).parameters
    except (TypeError, ValueError):        # a builtin without a signature: let tracing say what it is
        return False


def _made_in(kernel: Kernel, module: Any) -> bool:
    """Whether `module`'s code made `kernel` (op.kernel(make_block()) of a helper's factory included),
    rather than importing it."""
    return kernel.made_in == module.__name__


def load_target(target: str) -> tuple[Kernel, Any]:
    """'path.py:func' -> (the function as a Kernel, the module); 'path.py' -> its one @op.kernel."""
    kernels, module = load_targets(target)
    if len(kernels) > 1:
        names = ", ".join(k.name for k in kernels)
        raise UsageError(f"{target} makes {len(kernels)} kernels ({names}): name one as {target}:FUNCTION")
    return kernels[0], module


def target_inputs(kernel: Kernel, module: Any, given: Sequence[str], command: str = "--explain") -> dict[str, Any]:
    """The kernel's tensor arguments by name, placeholders or arrays: the module's example_inputs()
    (the entries this kernel's parameters name), with each --input in place of what it names (a
    whole argument, or one array of a container: p.layers[0].w). `command` is the one a hint names."""
    flags = _nested([parse_input(t) for t in given])
    unknown = [n for n in flags if n not in kernel.parameter_names]
    if unknown:
        raise UsageError(f"kernel {kernel.name} has no parameter {unknown[0]!r}; its parameters are "
                         f"{', '.join(kernel.parameter_names)}")
    has_examples = callable(getattr(module, "example_inputs", None))
    offered = _example_inputs(kernel, module) if has_examples else {}
    examples = {n: v for n, v in offered.items() if n in kernel.parameter_names}
    inputs = {n: _overlaid(examples[n], flags[n], n) if n in examples and n in flags else flags.get(n, examples.get(n))
              for n in kernel.parameter_names if n in flags or n in examples}
    missing = [n for n in _required(kernel) if n not in inputs]
    missing += [m for n, v in inputs.items() for m in _missing_items(v, n)]
    if missing and has_examples:
        raise UsageError(f"kernel {kernel.name} takes {', '.join(kernel.parameter_names)}; example_inputs() of "
                         f"{module.__file__} has no {', '.join(missing)} "
                         f"(it gives {', '.join(map(str, offered)) or 'nothing'}): "
                         "add them, or pass --input")
    if missing and flags:
        raise UsageError(f"kernel {kernel.name} takes {', '.join(kernel.parameter_names)}; no --input for "
                         f"{', '.join(missing)}")
    if missing:
        shapes = " ".join(f"--input {n}=DIMS:DTYPE" for n in missing)
        raise UsageError(f"{kernel.name} needs --input for each tensor argument (or define example_inputs() "
                         f"in its module): tessera-rewrite {command} {Path(module.__file__).name}:{kernel.name} "
                         f"{shapes}, each DIMS its shape (4x16x64) and DTYPE its dtype (bf16)")
    return inputs


def _example_inputs(kernel: Kernel, module: Any) -> dict[str, Any]:
    where = f"example_inputs() of {module.__file__}"
    try:
        given = module.example_inputs()
    except Exception as e:
        raise UsageError(f"{where} raised {type(e).__name__}: {e}{user_line(e, module.__file__)}") from None
    if not isinstance(given, dict):
        raise UsageError(f"{where} returned a {type(given).__name__}: it should return a dict of "
                         "arrays or op.tensor placeholders by parameter name")
    own = given.get(kernel.name)
    if isinstance(own, dict) and kernel.name not in kernel.parameter_names:    # {kernel: {parameter: ...}}
        given = own
    return given


def _overlaid(example: Any, flag: Any, path: str) -> Any:
    """An example argument with the arrays --input gives in place of its own: containers merge item
    by item (a dict's keys must be the example's: a misspelt one would go unread), anything else is
    replaced."""
    if isinstance(flag, dict) and isinstance(example, dict):
        unknown = [k for k in flag if k not in example]
        if unknown:
            raise UsageError(f"--input {path}.{unknown[0]}: example_inputs() gives {path} the keys "
                             f"{', '.join(map(str, example))}")
        return {k: _overlaid(v, flag[k], f"{path}.{k}") if k in flag else v for k, v in example.items()}
    if isinstance(flag, list) and isinstance(example, (list, tuple)):      # a longer list adds items
        items = [flag[i] if i >= len(example) else example[i] if i >= len(flag) or flag[i] is None
                 else _overlaid(example[i], flag[i], f"{path}[{i}]") for i in range(max(len(flag), len(example)))]
        return type(example)(items)
    return flag


def _nested(parsed: list[tuple[str, TensorSpec]]) -> dict[str, Any]:
    """--input values by argument, those named by paths (p.w, p.layers[0].w) built into the dicts
    and lists the paths spell."""
    inputs: dict[str, Any] = {}
    for path, spec in parsed:
        head = re.match(r"[A-Za-z_]\w*", path).group(0)
        steps = [m.group(1) if m.group(1) is not None else int(m.group(2)) for m in PATH_STEP.finditer(path, len(head))]
        if not steps:
            if head in inputs:
                raise UsageError(f"--input {head}=... is given twice: give each argument once")
            inputs[head] = spec
            continue
        node, key = inputs, head
        for step in steps:
            if key not in node:
                node[key] = {} if isinstance(step, str) else []
            node = node[key]
            if isinstance(node, list) != isinstance(step, int):
                raise UsageError(f"--input {path}: {key!r} is used both as a dict and as a list")
            if isinstance(step, int):
                node.extend([None] * (step + 1 - len(node)))
            key = step
        if node[key] is not None if isinstance(node, list) else key in node:
            raise UsageError(f"--input {path}=... is given twice: give each array once")
        node[key] = spec
    return inputs


def _missing_items(value: Any, path: str) -> list[str]:
    """Paths of list items no --input gave (p.layers[1] when only [0] and [2] were)."""
    if isinstance(value, dict):
        return [m for k, v in value.items() for m in _missing_items(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [m for i, v in enumerate(value) for m in ([f"{path}[{i}]"] if v is None else _missing_items(v, f"{path}[{i}]"))]
    return []


def _required(kernel: Kernel) -> list[str]:
    return [p.name for p in inspect.signature(kernel.fn).parameters.values()
            if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def source_file(fn: object) -> str:
    """The file a kernel's function (a partial's, a callable object's, a wrapped one's) was written
    in, or '' where it has none."""
    try:
        return inspect.getsourcefile(inspect.unwrap(function_of(fn))) or ""
    except TypeError:
        return ""


def user_line(error: BaseException, filename: str) -> str:
    """' at FILE:LINE: source' of the deepest frame of `error`'s traceback in the user's file."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == filename]
    if not frames:
        return ""
    frame = frames[-1]
    return f" — at {frame.filename}:{frame.lineno} in {frame.name}: {(frame.line or '').strip()}"
