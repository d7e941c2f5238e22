"""A/B on the CPU: e2e eagle3 auto at batch 8 with bare runs (BARE_AFTER 16) against without (never bare)."""
import sys
import specdec.engine
specdec.engine.BARE_AFTER = int(sys.argv[1])
from specdec_tools.bench import main
main(["--device", "cpu", "--no-peers", "--no-plots", "--no-progress", "--temperature", "0", "0.8", "--batch", "8",
      "--prompts", "8", "--max-tokens", "64", "--repeats", "2", "--threads", "1", "--methods", "eagle3:3@auto",
      "--out", "/tmp/ab", "--name", f"bare{sys.argv[1]}"], small=False)
