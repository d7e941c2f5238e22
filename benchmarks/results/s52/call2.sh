# s52 call 2 (fresh machine, ~590 s): the trained bench pair (s46's pair.sh into /tmp/bm), then medusa:2 and eagle3:3
# at batch 32, T = 0 (where fixed k pays): this library (timed plain steps bare, bursts unread) fixed and auto, then
# s51's (.old-tree: 147274b first on PYTHONPATH) auto, each e2e in its own process on the same machine and pair.
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
t0=$SECONDS
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > /tmp/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/c2 && OUT=/tmp/c2 bash benchmarks/results/h100/s46-2026-12-06/pair.sh
echo "pair built at $((SECONDS - t0)) s"
OLD="$PWD/.old-tree/core:$PWD/.old-tree/plugins/medusa:$PWD/.old-tree/plugins/eagle:"
run() {  # name methods temperature [PYTHONPATH prefix] [limit]
  (cd benchmarks && PYTHONPATH="${4:-}$PYTHONPATH" timeout ${5:-100} python3 e2e.py --device cuda --model /tmp/bm/bench \
    --no-peers --no-plots --no-progress --temperature $3 --method-option eagle3.model=/tmp/bm/bench-eagle3 \
    --method-option medusa.model=/tmp/bm/bench-medusa --out /tmp/c2 --name $1 --batch ${BATCH:-32} --prompts 64 \
    --max-tokens 128 --repeats 2 --workloads completion repeated --methods $2 > /tmp/c2/$1.log 2>&1)
  echo "$1 rc $? at $((SECONDS - t0)) s"; grep -E "^\| (completion|repeated) " /tmp/c2/$1.md | cut -c1-150
}
run new-b32-t0 "medusa:2@fixed medusa:2@auto eagle3:3@fixed eagle3:3@auto" 0 "" 110
left=$((585 - (SECONDS - t0))); [ $left -gt 40 ] && run old-b32-t0 "medusa:2@auto eagle3:3@auto" 0 "$OLD" $left
tar czf $OUT/c2.tgz -C /tmp c2
