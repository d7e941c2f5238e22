"""The fused Llama-family forward now lives in the core (:mod:`specdec.fused`), where the target uses it too;
this module keeps the plugin's old import path working."""

from specdec.fused import (  # noqa: F401
    FusedLlama,
    add_rmsnorm,
    fused_support,
    rope_rows,
    rope_store,
    rope_store_rows,
    rope_table,
    silu_mul,
)

__all__ = ["FusedLlama", "add_rmsnorm", "fused_support", "rope_rows", "rope_store", "rope_store_rows", "rope_table",
           "silu_mul"]
