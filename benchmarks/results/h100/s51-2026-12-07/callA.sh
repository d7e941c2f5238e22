# s51 call A (fresh machine, ~580 s): the trained bench pair (s46's pair.sh into /tmp/bm), then medusa:2 and eagle3:3
# at T = 0.8, batch 8, seeded: this library (seeded drafts deferred on the device, no draft probs for a batch that
# reads none) fixed and auto, then s50's library (.old-tree: 1854586's core and plugins first on PYTHONPATH) fixed,
# each e2e in its own process on the same machine and pair.
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
t0=$SECONDS
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > /tmp/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/cA && OUT=/tmp/cA bash benchmarks/results/h100/s46-2026-12-06/pair.sh
echo "pair built at $((SECONDS - t0)) s"
OLD="$PWD/.old-tree/core:$PWD/.old-tree/plugins/medusa:$PWD/.old-tree/plugins/eagle:"
run() {  # name methods [PYTHONPATH prefix] [limit]
  (cd benchmarks && PYTHONPATH="${3:-}$PYTHONPATH" timeout ${4:-100} python3 e2e.py --device cuda --model /tmp/bm/bench \
    --no-peers --no-plots --no-progress --temperature 0.8 --method-option eagle3.model=/tmp/bm/bench-eagle3 \
    --method-option medusa.model=/tmp/bm/bench-medusa --out /tmp/cA --name $1 --batch ${BATCH:-8} --prompts 64 \
    --max-tokens 128 --repeats 2 --workloads completion repeated --methods $2 > /tmp/cA/$1.log 2>&1)
  echo "$1 rc $? at $((SECONDS - t0)) s"; grep -E "^\| (completion|repeated) " /tmp/cA/$1.md | cut -c1-150
}
run new-b8 "medusa:2@fixed medusa:2@auto eagle3:3@fixed eagle3:3@auto" "" 110
run old-b8 "medusa:2@fixed eagle3:3@fixed" "$OLD" 80
tar czf $OUT/cA.tgz -C /tmp cA
