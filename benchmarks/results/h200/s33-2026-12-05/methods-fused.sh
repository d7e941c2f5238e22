# issue 28's last line: each method's speedup over the fused baseline against its speedup over HF's layers in our
# graphs (--no-fused-forward, the baseline before issue 28), batch 1, greedy, same call. TINY=1: the bundled tiny
# pair and its bundled heads (no build); else the trained bench pair and its eagle3 head in /tmp/bm
export PYTHONPATH=$PWD/.device-pkgs
if [ "${TINY:-0}" = 1 ]; then
  models=""; extra="draft_model:3@fixed"
else
  [ -f /tmp/bm/bench-eagle3/config.json ] || { echo "no /tmp/bm/bench-eagle3: a fresh machine"; exit 3; }
  extra=""
  models="--model /tmp/bm/bench --method-option eagle3.model=/tmp/bm/bench-eagle3"
fi
cd benchmarks
for form in fused hf; do
  flag=""; [ $form = hf ] && flag="--no-fused-forward"
  timeout ${LIMIT:-200} python3 e2e.py --device cuda $models --no-peers --no-plots --no-progress $flag \
    --temperature 0 --batch 1 --prompts 4 --max-tokens 128 --repeats 3 --out $OUT --name methods-$form \
    --methods ${METHODS:-ngram:4@fixed suffix:4@fixed eagle3:3@fixed $extra} > $OUT/methods-$form.log 2>&1
  echo "$form rc $?"
done
for form in fused hf; do echo "== $form"; grep "^|" $OUT/methods-$form.md | head -20; done
