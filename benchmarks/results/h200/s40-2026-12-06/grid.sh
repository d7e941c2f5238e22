# s40: issue 24's batch-8 grid (trained bench pair in /tmp/bm, built by `BUDGET=0 bash
# benchmarks/results/h100/s37-2026-12-06/call2.sh` in the call before), auto rows only against the baseline, six
# passes a row (s39's fixed-k rows stand: fixed k drafts every step, untouched by this session's changes).
[ -f /tmp/bm/bench-eagle3/config.json ] || { echo "no /tmp/bm/bench-eagle3: a fresh machine"; exit 3; }
export PYTHONPATH=$PWD/.device-pkgs
python3 -c "import specdec" 2>/dev/null || python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > $OUT/install.log 2>&1
cd benchmarks
timeout ${LIMIT:-420} python3 e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress \
  --temperature 0 0.8 --method-option eagle3.model=/tmp/bm/bench-eagle3 --out $OUT --name grid-b8-auto --batch 8 \
  --prompts 64 --max-tokens 128 --repeats ${REPEATS:-6} \
  --methods ${METHODS:-eagle3:3@auto ngram:4@auto suffix:4@auto} > $OUT/grid-b8-auto.log 2>&1
echo "grid rc $?"
python3 auto_table.py $OUT/grid-b8-auto.json 2>&1 | tail -14
