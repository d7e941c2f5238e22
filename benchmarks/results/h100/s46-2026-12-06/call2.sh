# s46 call 2 (same warm machine as call 1, for its /tmp/bm): this session's head-rows change old against new on the
# random bench pair (traces.sh), then issue 25 on the trained pair at batch 1: trees against chains
# (gpu_heads.sh STAGE=trees, B32=0; call 3 runs batch 32).
[ -f /tmp/bm/bench-eagle3/config.json ] || { echo "no /tmp/bm (a fresh machine): run call1.sh first"; ls /tmp/bm; }
export PYTHONPATH=$PWD/.device-pkgs
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > $OUT/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
EACH=${EACH:-35} bash benchmarks/results/h100/s46-2026-12-06/traces.sh
[ -f /tmp/bm/bench-eagle3/config.json ] && OUT=$OUT BM=/tmp/bm STAGE=trees B32=0 B1_LIMIT=${B1_LIMIT:-330} bash benchmarks/gpu_heads.sh
