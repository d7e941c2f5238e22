# s51 call B (the warm machine of call A, its pair in /tmp/bm): the whole CUDA suite in 8 shards (nothing beside it:
# an 80 GB H100), then batch 32 at T = 0.8 as call A's batch 8: this library fixed and auto, s50's fixed.
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
S=benchmarks/results/h100/s51-2026-12-07
SHARDS=8 SHARD_THREADS=1 SUITE_LIMIT=${SUITE_LIMIT:-330} OUT=/tmp/gc bash benchmarks/gpu_check.sh > /tmp/gc.console 2>&1
grep -v "^DEBUG" /tmp/gc.console | tail -25
tar czf $OUT/gc.tgz -C /tmp gc gc.console
t0=$SECONDS
OLD="$PWD/.old-tree/core:$PWD/.old-tree/plugins/medusa:$PWD/.old-tree/plugins/eagle:"
run() {
  (cd benchmarks && PYTHONPATH="${3:-}$PYTHONPATH" timeout ${4:-100} python3 e2e.py --device cuda --model /tmp/bm/bench \
    --no-peers --no-plots --no-progress --temperature 0.8 --method-option eagle3.model=/tmp/bm/bench-eagle3 \
    --method-option medusa.model=/tmp/bm/bench-medusa --out /tmp/cB --name $1 --batch 32 --prompts 64 \
    --max-tokens 128 --repeats 2 --workloads completion repeated --methods $2 > /tmp/cB/$1.log 2>&1)
  echo "$1 rc $? at $((SECONDS - t0)) s"; grep -E "^\| (completion|repeated) " /tmp/cB/$1.md | cut -c1-150
}
mkdir -p /tmp/cB
[ -d /tmp/bm/bench-medusa ] && run new-b32 "medusa:2@fixed medusa:2@auto eagle3:3@fixed eagle3:3@auto" "" 120
[ -d /tmp/bm/bench-medusa ] && run old-b32 "medusa:2@fixed eagle3:3@fixed" "$OLD" 90
tar czf $OUT/cB.tgz -C /tmp cB
