# s46 call 3 (same warm machine): issue 25 on the trained pair at batch 32, fixed trees and trees under the auto
# policy against chains (gpu_heads.sh STAGE=trees, B1=0).
OUT=$OUT BM=/tmp/bm STAGE=trees B1=0 B32_LIMIT=${B32_LIMIT:-300} bash benchmarks/gpu_heads.sh
