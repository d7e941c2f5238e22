"""A/B on the CPU: e2e eagle3 auto at batch 8 with bare runs after BARE_AFTER plain steps (16) against never bare
(a huge BARE_AFTER), bare runs let onto the CPU. Run from benchmarks/: python results/cpu/s25-2026-12-04/ab/ab.py 16"""

import sys

import specdec.engine
from specdec_tools.bench import main


def run(bare_after: int) -> None:
    specdec.engine.BARE_AFTER = bare_after
    specdec.engine.BARE_DEVICES = ("cuda", "cpu")  # the run of this A/B came before bare runs were CUDA-only
    main(["--device", "cpu", "--no-peers", "--no-plots", "--no-progress", "--temperature", "0", "0.8", "--batch", "8",
          "--prompts", "8", "--max-tokens", "64", "--repeats", "2", "--threads", "1", "--methods", "eagle3:3@auto",
          "--out", "/tmp/ab", "--name", f"bare{bare_after}"], small=False)


if __name__ == "__main__":
    run(int(sys.argv[1]))
