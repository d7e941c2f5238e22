"""specdec: standalone, pluggable speculative decoding for PyTorch.

A proposer (plugin) drafts k tokens, the target model verifies them in one forward pass, and the
rejection sampler keeps the longest correct prefix, so the output is exactly what the target alone
would produce. See docs/design.md for the contracts behind every name exported here.
"""

from __future__ import annotations

from typing import Any

from specdec import metrics
from specdec.config import NoOptions, SpeculativeConfig, as_speculative_config, create_proposer
from specdec.errors import DraftValidationError, PluginValidationError, SpecDecError, UnknownMethodError
from specdec.hookspecs import hookimpl, hookspec
from specdec.metadata import SpecDecodeMetadata
from specdec.proposer import DraftBatch, Drafts, HiddenStateRequest, Proposer
from specdec.registry import (
    MethodInfo,
    TrainerInfo,
    available_methods,
    available_trainers,
    get_proposer_class,
    get_trainer_class,
    plugin_errors,
    register_plugin,
    unregister_plugin,
)
from specdec.rejection_sampler import PLACEHOLDER_TOKEN_ID, RejectionSampler, rejection_sample
from specdec.sampling import SamplingMetadata, SamplingParams

__version__ = "0.1.0"

# Names whose modules import transformers: loaded on first use so `specdec methods` stays fast.
_LAZY = {
    "LLM": "specdec.engine",
    "RequestOutput": "specdec.requests",
    "RequestMetrics": "specdec.requests",
    "TargetModel": "specdec.target",
    "HFTargetModel": "specdec.target",
    "ModelRunner": "specdec.runner",
    "TargetOutput": "specdec.runner",
    "bundled_model": "specdec.models",
    # Training code lives outside the runtime package (specdec_tools): loaded only when asked for.
    "Trainer": "specdec_tools.train",
}

__all__ = [
    "DraftBatch",
    "DraftValidationError",
    "Drafts",
    "HFTargetModel",
    "HiddenStateRequest",
    "LLM",
    "MethodInfo",
    "ModelRunner",
    "NoOptions",
    "PLACEHOLDER_TOKEN_ID",
    "PluginValidationError",
    "Proposer",
    "RejectionSampler",
    "RequestMetrics",
    "RequestOutput",
    "SamplingMetadata",
    "SamplingParams",
    "SpecDecError",
    "SpecDecodeMetadata",
    "SpeculativeConfig",
    "TargetModel",
    "TargetOutput",
    "Trainer",
    "TrainerInfo",
    "UnknownMethodError",
    "as_speculative_config",
    "available_methods",
    "available_trainers",
    "bundled_model",
    "create_proposer",
    "get_proposer_class",
    "get_trainer_class",
    "hookimpl",
    "hookspec",
    "metrics",
    "plugin_errors",
    "register_plugin",
    "rejection_sample",
    "unregister_plugin",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'specdec' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
