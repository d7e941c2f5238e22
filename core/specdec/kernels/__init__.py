"""Fused GPU kernels, optional: the torch implementations in the rest of the package stay the reference.

Importing this package never imports triton. Each kernel module (``rejection_triton``) imports it at
the top and sits beside a slow loop reference (``rejection_naive``) that its parity tests compare
against; those tests run on CPU under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import functools

__all__ = ["triton_available"]


@functools.cache
def triton_available() -> bool:
    """Whether ``import triton`` succeeds (it is an optional dependency)."""
    try:
        import triton  # noqa: F401
    except (ImportError, OSError, RuntimeError):
        return False
    return True
