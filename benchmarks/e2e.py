"""End-to-end benchmark: every installed method vs the baseline vs Hugging Face ``generate()``, one run.

A thin command line over :mod:`specdec_tools.bench` (which ``specdec bench`` also runs, with small defaults).
Workloads come from held-out standard-library files (completion, grounded edit, repeated requests);
greedy outputs are checked against the baseline before any speedup is reported. Writes
``<out>/<name>.json``, ``<name>.md`` and ``<name>_speedup.png`` / ``<name>_acceptance.png``
(``--out`` defaults to ``$OUT`` when set, else benchmarks/results/e2e).

    python benchmarks/e2e.py                                     # CPU: bundled tiny, batch 1 and 8
    python benchmarks/e2e.py --device cuda --model /tmp/zoo/bench --draft-model /tmp/zoo/bench-draft \\
        --batch 1 32 --prompts 32 --prompt-tokens 512 --max-tokens 128
"""

from __future__ import annotations

from specdec_tools.bench import (  # noqa: F401  (importable from here too)
    Settings,
    build_workloads,
    compare_greedy,
    markdown_report,
    run_benchmark,
    write_outputs,
)
from specdec_tools.bench import main as _main


def main(argv: list[str] | None = None) -> int:
    """Parse the flags (see ``--help``), run the grid, write JSON / markdown / plots, print the table."""
    return _main(argv, small=False)


if __name__ == "__main__":
    raise SystemExit(main())
