"""A guard that raises on every host read of tensor data: what would be a device-to-host sync on a GPU.

Used by tests/distributed/test_sync_free.py on CPU ranks (where nothing is a real sync, so torch's
``torch.cuda.set_sync_debug_mode`` has nothing to see): inside ``no_host_reads()`` the Tensor methods that read
values on the host (``.tolist()``, ``.item()``, ``.cpu()``, ``.numpy()``, ``int()``, ``float()``, ``bool()``,
``operator.index``) raise ``HostSyncError``, and so do the aten ops whose output shape depends on tensor
values (the GPU reads those back: ``nonzero``, ``masked_select``, ``unique``, ``bincount``,
``repeat_interleave`` without ``output_size``) and ``_local_scalar_dense`` (what ``item()`` runs in C++).
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_METHODS = ("tolist", "item", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")
_OPS = {"aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::masked_select", "aten::bincount",
        "aten::_unique", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive"}


class HostSyncError(RuntimeError):
    pass


class _NoDataDependentOps(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        if name in _OPS or (name == "aten::repeat_interleave" and isinstance(args[0], torch.Tensor)
                            and len(args) == 1 and kwargs.get("output_size") is None):
            raise HostSyncError(f"{func} reads tensor values on the host (a device-to-host sync on GPU)")
        return func(*args, **kwargs)


@contextlib.contextmanager
def no_host_reads():
    saved = {m: getattr(torch.Tensor, m) for m in _METHODS}

    def raiser(name):
        def f(self, *a, **k):
            raise HostSyncError(f"Tensor.{name}() inside the sync-free path (a device-to-host sync on GPU)")
        return f

    try:
        for m in _METHODS:
            setattr(torch.Tensor, m, raiser(m))
        with _NoDataDependentOps():
            yield
    finally:
        for m, f in saved.items():
            setattr(torch.Tensor, m, f)
