# s44 call 2: issue 28's Done-when table in one run (bench, 1B, 3B x batch 1, 8; HF eager and static compiled).
SIZES="bench 1b 3b" BATCHES="1 8" LIMIT=${LIMIT:-560} bash benchmarks/results/h100/s43-2026-12-06/call2.sh
