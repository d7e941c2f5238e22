LIMIT=430 bash benchmarks/results/h200/s32-2026-12-05/next/grid-long.sh
