"""Fused kernels, optional: the torch implementations in the rest of the package stay the reference.

Importing this package never imports triton or numba. Each Triton kernel module (``rejection_triton``,
``keyed_triton``, ``tree_triton``) imports triton at the top and is checked against a reference (``rejection_naive``,
the torch functions) by parity tests that run on CPU under ``TRITON_INTERPRET=1``; ``keyed_numba`` is the CPU's keyed
sampling pass where numba is installed.
"""

from __future__ import annotations

import functools

__all__ = ["numba_available", "triton_available"]


@functools.cache
def triton_available() -> bool:
    """Whether ``import triton`` succeeds (it is an optional dependency)."""
    try:
        import triton  # noqa: F401
    except (ImportError, OSError, RuntimeError):
        return False
    return True


@functools.cache
def numba_available() -> bool:
    """Whether ``import numba`` succeeds (an optional dependency of the core; the ngram plugin needs it)."""
    try:
        import numba  # noqa: F401
    except (ImportError, OSError, RuntimeError):
        return False
    return True
