"""A kernel defined in a class body: one kernel per instance, bound to it without keeping it alive.

`instance.method` gives a BoundKernel: the instance's own kernel (made on the first lookup, from
the method bound through a weak reference, and dropped when the instance is collected, so a copy
or a pickle of the instance carries none) together with the instance, which it holds while it is
used, as a bound method holds self. An instance that cannot be weakly referenced (`__slots__`
without `'__weakref__'`) gets a new kernel at each lookup, which traces anew at each call: a
warning says so once per class.

>>> from tessera_rw import op
>>> class Scale:
...     def __init__(self, s):
...         self.s = s
...     @op.kernel
...     def forward(self, x):
...         return x * self.s
>>> a = Scale(2.0)
>>> a.forward.kernel is a.forward.kernel, a.forward.kernel is Scale(3.0).forward.kernel
(True, False)
"""

from __future__ import annotations

import inspect
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from tessera_rw.kernel import Kernel


class WeakBoundMethod:
    """`func` bound to `obj` through a weak reference; it reads as a bound method (`__self__`,
    `__func__`, the signature without self) to inspect and to the captures' guards."""

    def __init__(self, func: Callable, obj: Any):
        self.__name__, self.__qualname__ = func.__name__, func.__qualname__
        self.__module__, self.__doc__ = func.__module__, func.__doc__
        self.__func__ = func
        self._instance = weakref.ref(obj)
        signature = inspect.signature(func)
        self.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])

    @property
    def __self__(self) -> Any:
        obj = self._instance()
        if obj is None:
            raise ReferenceError(f"the instance {self.__func__.__qualname__} was bound to no longer exists")
        return obj

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__func__(self.__self__, *args, **kwargs)


class BoundKernel:
    """An instance's kernel and the instance: calls, `explain`, `trace`, `program`, `schedule` and
    the rest go to the kernel."""
    __slots__ = ("kernel", "instance")

    def __init__(self, kernel: Kernel, instance: Any):
        self.kernel, self.instance = kernel, instance

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.kernel(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernel, name)

    def __repr__(self) -> str:
        return f"<bound {self.kernel!r} of {type(self.instance).__name__}>"


class InstanceKernels:
    """A descriptor's kernels, one per live instance (by id, checked against a weak reference)."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[weakref.ref, Kernel]] = {}
        self._warned: set[type] = set()

    def bound(self, descriptor: Kernel, obj: Any) -> BoundKernel:
        found = self._by_id.get(id(obj))
        if found is not None and found[0]() is obj:
            return BoundKernel(found[1], obj)
        try:
            ref = weakref.ref(obj, lambda _, key=id(obj), table=self._by_id: table.pop(key, None))
        except TypeError:
            self._warn_once(descriptor, type(obj))
            return BoundKernel(descriptor.for_method(descriptor.fn.__get__(obj, type(obj))), obj)
        kernel = descriptor.for_method(WeakBoundMethod(descriptor.fn, obj))
        self._by_id[id(obj)] = (ref, kernel)
        return BoundKernel(kernel, obj)

    def _warn_once(self, descriptor: Kernel, cls: type) -> None:
        if cls not in self._warned:
            self._warned.add(cls)
            warnings.warn(f"kernel {descriptor.name}: {cls.__name__} instances cannot be weakly referenced "
                          f"(__slots__ without '__weakref__'), so the kernel cannot be kept per instance and "
                          f"traces anew at each call; add '__weakref__' to {cls.__name__}.__slots__",
                          RuntimeWarning, stacklevel=4)
