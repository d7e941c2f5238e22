# s41: issue 24's grid, fixed and auto rows in one run on one machine (trained bench pair in /tmp/bm, built by
# `BUDGET=0 bash benchmarks/results/h100/s37-2026-12-06/call2.sh` in the call before); BATCH (default 8), REPEATS
# passes a row, METHODS as e2e takes them.
[ -f /tmp/bm/bench-eagle3/config.json ] || { echo "no /tmp/bm/bench-eagle3: a fresh machine"; exit 3; }
export PYTHONPATH=$PWD/.device-pkgs
python3 -c "import specdec" 2>/dev/null || python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > $OUT/install.log 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
B=${BATCH:-8}
cd benchmarks
timeout ${LIMIT:-560} python3 e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress \
  --temperature 0 0.8 --method-option eagle3.model=/tmp/bm/bench-eagle3 --out $OUT --name grid-b$B --batch $B \
  --prompts ${PROMPTS:-64} --max-tokens 128 --repeats ${REPEATS:-6} \
  --methods ${METHODS:-eagle3:3@auto ngram:4@auto suffix:4@auto eagle3:3@fixed ngram:4@fixed suffix:4@fixed} \
  > $OUT/grid-b$B.log 2>&1
echo "grid rc $?"
python3 auto_table.py $OUT/grid-b$B.json 2>&1 | tail -16
