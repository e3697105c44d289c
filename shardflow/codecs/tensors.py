"""Torch values without importing torch: `import shardflow.codecs` must work where torch is absent
(and stay fast where it is), so torch is recognised by its module name and imported only when a
codec really needs it."""

from __future__ import annotations

from typing import Any

import numpy as np


def import_torch() -> Any:
    """torch, or an ImportError that says which extra installs it."""
    try:
        import torch
    except ImportError as e:
        raise ImportError("this needs torch; install it with `pip install shardflow[torch]`") from e
    return torch


def is_tensor(value: Any) -> bool:
    """True for torch tensors, without importing torch."""
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def tensor_to_numpy(t: Any) -> np.ndarray:
    """A CPU numpy view of a tensor; dtypes numpy lacks (bfloat16, float8) become float32."""
    t = t.detach().cpu()
    if str(t.dtype) in ("torch.bfloat16", "torch.float8_e4m3fn", "torch.float8_e5m2"):
        t = t.float()  # numpy has no such dtypes
    return t.numpy()


def as_array(value: Any) -> np.ndarray:
    """A numpy array from a tensor, an array or anything np.asarray takes."""
    return tensor_to_numpy(value) if is_tensor(value) else np.asarray(value)
