"""Alias of :mod:`specdec_tools.zoo` (training the bundled models), kept so the documented
``python -m specdec.zoo`` and ``from specdec import zoo`` still work: the recipe itself lives
outside the runtime package, and ``import specdec`` does not load it."""

from specdec_tools.zoo import *  # noqa: F403
from specdec_tools.zoo import __all__, main  # noqa: F401

if __name__ == "__main__":
    raise SystemExit(main())
