# s42 call A: the trained bench pair's build into /tmp/bm (for call B's grid), then on the random pair, without
# --trace, every engine's stalls (steps over 4x its median) beside auto's steps: eagle3 and ngram, batch 8, T = 0.8.
BUDGET=0 bash benchmarks/results/h100/s37-2026-12-06/call2.sh
TRACE=0 METHODS="eagle3:3 ngram:4" WORKLOADS="completion" bash benchmarks/results/h100/s42-2026-12-06/plain-steps.sh 2>&1 | grep -v Capturing
