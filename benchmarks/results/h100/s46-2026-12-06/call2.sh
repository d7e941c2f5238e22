# s46 call 2 (same warm machine as call 1: its /tmp/bm): issue 25 on the trained pair, trees against chains
# (gpu_heads.sh STAGE=trees: batch 1 three workloads, then batch 32 completion with the auto policy).
[ -f /tmp/bm/bench-eagle3/config.json ] || { echo "no /tmp/bm (a fresh machine): run call1.sh first"; ls /tmp/bm; exit 3; }
OUT=$OUT BM=/tmp/bm STAGE=trees B1_LIMIT=${B1_LIMIT:-320} B32_LIMIT=${B32_LIMIT:-230} bash benchmarks/gpu_heads.sh
