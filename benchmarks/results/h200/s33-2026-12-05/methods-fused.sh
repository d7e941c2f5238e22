# issue 28's last line: each method's speedup over the fused baseline against its speedup over HF's layers in our
# graphs (--no-fused-forward, the baseline before issue 28), the trained bench pair, batch 1, greedy, same call
[ -f /tmp/bm/bench-eagle3/config.json ] || { echo "no /tmp/bm/bench-eagle3: a fresh machine"; exit 3; }
export PYTHONPATH=$PWD/.device-pkgs
cd benchmarks
for form in fused hf; do
  flag=""; [ $form = hf ] && flag="--no-fused-forward"
  timeout ${LIMIT:-200} python3 e2e.py --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress $flag \
    --temperature 0 --batch 1 --prompts 4 --max-tokens 128 --repeats 3 \
    --method-option eagle3.model=/tmp/bm/bench-eagle3 --out $OUT --name methods-$form \
    --methods ngram:4@fixed suffix:4@fixed eagle3:3@fixed eagle3:5@fixed > $OUT/methods-$form.log 2>&1
  echo "$form rc $?"
done
for form in fused hf; do echo "== $form"; grep "^|" $OUT/methods-$form.md | head -20; done
