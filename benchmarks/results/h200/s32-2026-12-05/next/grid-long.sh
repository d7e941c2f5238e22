# issue 24's grid at batch 8 with passes ~8x longer than s30's grid.sh (64 prompts x 128 tokens: s32's 0.1 s passes
# gave a per-pass sd of 0.2-0.3 in log on the H200), auto rows against the baseline first, then fixed k
[ -f /tmp/bm/bench-eagle3/config.json ] || { echo "no /tmp/bm/bench-eagle3: a fresh machine"; exit 3; }
export PYTHONPATH=$PWD/.device-pkgs
cd benchmarks
timeout ${LIMIT:-400} python3 e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress \
  --temperature 0 0.8 --method-option eagle3.model=/tmp/bm/bench-eagle3 --out $OUT --name grid-long-b8 --batch 8 \
  --prompts 64 --max-tokens 128 --repeats 3 \
  --methods ${METHODS:-eagle3:3@auto ngram:4@auto suffix:4@auto eagle3:3@fixed ngram:4@fixed suffix:4@fixed} \
  > $OUT/grid-long-b8.log 2>&1
echo "grid rc $?"
python3 auto_table.py $OUT/grid-long-b8.json 2>&1 | tail -30
