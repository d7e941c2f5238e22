"""Tools around specdec that its runtime never needs: training the bundled models
(:mod:`specdec_tools.zoo`, also ``python -m specdec.zoo``) and the end-to-end benchmark
(:mod:`specdec_tools.bench`, behind ``specdec bench`` and ``benchmarks/e2e.py``).

Shipped in the specdec-core distribution beside ``specdec``, which never imports this package at
import time: only the ``specdec bench`` subcommand and the ``specdec.zoo`` alias load it.
"""
