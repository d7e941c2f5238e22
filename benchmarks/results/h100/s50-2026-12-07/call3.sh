# s50 call 3 (fresh machine, ~590 s): the trained bench pair (s46's pair.sh into /tmp/bm), then medusa and eagle3 at
# T = 0.8, batch 32, fixed and auto, seeded drafting by DraftKeys (s49 before it: medusa fixed 0.21-0.30x, eagle3
# 0.49-0.66x; call 1 of this session measured batch 8).
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
t0=$SECONDS
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > /tmp/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/c3 && OUT=/tmp/c3 bash benchmarks/results/h100/s46-2026-12-06/pair.sh
echo "pair built at $((SECONDS - t0)) s"
left=$(( ${TOTAL:-580} - (SECONDS - t0) - 10 ))
(cd benchmarks && timeout $left python3 e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress \
  --temperature 0.8 --method-option eagle3.model=/tmp/bm/bench-eagle3 --method-option medusa.model=/tmp/bm/bench-medusa \
  --out /tmp/c3 --name b32-t08 --batch 32 --prompts 64 --max-tokens 128 --repeats 2 --workloads completion repeated \
  --methods medusa:2@fixed medusa:2@auto eagle3:3@fixed eagle3:3@auto > /tmp/c3/e2e.log 2>&1)
echo "e2e rc $? at $((SECONDS - t0)) s"
tar czf $OUT/c3.tgz -C /tmp c3
grep -E "^\|" /tmp/c3/b32-t08.md | cut -c1-170 | head -14
