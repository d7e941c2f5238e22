"""specdec-plugin-eagle: EAGLE-1 and EAGLE-3 draft heads (methods ``eagle`` and ``eagle3``).

The heads (:mod:`specdec_eagle.heads`) are plain PyTorch modules; nothing heavy is imported here.
"""

from __future__ import annotations

__all__: list[str] = []
