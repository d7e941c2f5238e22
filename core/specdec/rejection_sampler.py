"""Lossless verification of drafted tokens against the target model (rejection sampling).

:func:`rejection_sample` is the torch implementation, which runs everywhere;
:class:`RejectionSampler` calls it, or on CUDA the Triton kernels (``specdec.kernels.rejection_triton``),
which emit the same tokens. The algorithm, and how the implementations share one stream of random
numbers, is described in :mod:`specdec.rejection_torch`, where the torch code lives.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

from specdec.kernels import triton_available
from specdec.metadata import SpecDecodeMetadata
from specdec.rejection_torch import (
    PLACEHOLDER_TOKEN_ID,
    SamplerInputs,
    _batch_flags,  # noqa: F401  (read by the tests through this module)
    _verify,  # noqa: F401  (read by the tests through this module)
    compute_target_probs,
    parse_output,
    prepare_sampler_inputs,
    rejection_sample,
    sample_prepared,
)
from specdec.sampling import SamplingMetadata

__all__ = [
    "PLACEHOLDER_TOKEN_ID",
    "RejectionSampler",
    "SamplerInputs",
    "compute_target_probs",
    "parse_output",
    "prepare_sampler_inputs",
    "rejection_sample",
    "sample_prepared",
]

logger = logging.getLogger(__name__)

SamplerImpl = Callable[
    [SpecDecodeMetadata, "torch.Tensor | None", torch.Tensor, SamplingMetadata], torch.Tensor
]


class RejectionSampler(torch.nn.Module):
    """Module wrapper around :func:`rejection_sample`.

    Args:
        impl: the function that does the work, with :func:`rejection_sample`'s signature. ``None``
            picks one per call from the logits' device (:func:`_select_impl`), which is where a fused
            kernel (Triton on CUDA) plugs in without touching callers.
    """

    def __init__(self, impl: SamplerImpl | None = None) -> None:
        super().__init__()
        self.impl = impl

    def forward(
        self,
        metadata: SpecDecodeMetadata,
        draft_probs: torch.Tensor | None,
        logits: torch.Tensor,
        sampling_metadata: SamplingMetadata,
    ) -> torch.Tensor:
        """Same arguments and result as :func:`rejection_sample`."""
        impl = self.impl if self.impl is not None else _select_impl(logits.device)
        return impl(metadata, draft_probs, logits, sampling_metadata)


def _select_impl(device: torch.device) -> SamplerImpl:
    """The implementation for ``device``: the Triton kernels on CUDA when triton imports, else the
    torch reference. Both consume the same random numbers, so the choice never changes the tokens."""
    if device.type == "cuda":
        impl = _triton_impl()
        if impl is not None:
            return impl
    return rejection_sample


@functools.cache
def _triton_impl() -> SamplerImpl | None:
    """``rejection_sample_triton``, or ``None`` (logged once) when triton is missing or unusable."""
    if not triton_available():
        logger.info("triton is not installed: the rejection sampler uses the torch implementation on CUDA")
        return None
    try:  # imported here, not at the top: it imports triton, an optional and slow-to-import dependency
        from specdec.kernels.rejection_triton import rejection_sample_triton
    except Exception as exc:  # a triton too old for the kernels must not break sampling
        logger.warning("Triton rejection kernels unavailable (%s: %s); using the torch implementation",
                       type(exc).__name__, exc)
        return None
    return rejection_sample_triton
