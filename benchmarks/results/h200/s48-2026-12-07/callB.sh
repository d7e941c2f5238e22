# s48 call B (TOTAL s, default 540): issue 25's trained-pair rows at batch 1, greedy, one e2e run each (4 prompts, 128
# tokens, 2 passes), s47's pair-trees.sh: on completion eagle3's chain (k=5) against its tree (k=6, top-k 8, 32 nodes)
# and medusa's chain (k=3) against its default tree; on repeated suffix's chain against its trees. Uses call A's
# /tmp/bm on a warm machine; builds it first (s46's pair.sh) on a fresh one.
TOTAL=${TOTAL:-540} bash benchmarks/results/h100/s47-2026-12-07/pair-trees.sh
