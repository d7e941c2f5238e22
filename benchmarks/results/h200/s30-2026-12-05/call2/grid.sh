# issue 24's grid at one batch size (B, default 8) on the trained bench target and call 1's eagle3 head: T = 0 and 0.8,
# the three workloads, eagle3 / ngram / suffix each fixed against auto (no bench-draft, medusa or dflash head: not built)
B=${B:-8}
[ -f /tmp/bm/bench-eagle3/config.json ] || { echo "no /tmp/bm/bench-eagle3: a fresh machine"; exit 3; }
export PYTHONPATH=$PWD/.device-pkgs
case "$B" in 1) shape="--prompts 8 --max-tokens 64" ;; 8) shape="--prompts 16 --max-tokens 96" ;;
             *) shape="--prompts 64 --max-tokens 64" ;; esac
cd benchmarks
timeout ${LIMIT:-400} python3 e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress \
  --temperature 0 0.8 --method-option eagle3.model=/tmp/bm/bench-eagle3 --out $OUT --name grid-b$B --batch $B $shape \
  --repeats 2 --methods ${METHODS:-eagle3:3@fixed eagle3:3@auto ngram:4@fixed ngram:4@auto suffix:4@fixed suffix:4@auto} \
  > $OUT/grid-b$B.log 2>&1
echo "grid b$B rc $?"
grep -E "^\| (completion|edit|repeated) " $OUT/grid-b$B.md | cut -c1-140
python3 auto_table.py $OUT/grid-b$B.json 2>&1 | tail -30
