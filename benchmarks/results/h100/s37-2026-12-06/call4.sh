# s37 call 4 (warm, after the grid): s36's end rule against the rule before it (LeastEnd), side by side in one
# process, on the rows it was built for (s36's next-device.md), each form a share of the call
export PYTHONPATH=$PWD/.device-pkgs
[ -f /tmp/bm/bench-eagle3/config.json ] || { echo "no /tmp/bm/bench-eagle3: a fresh machine"; exit 3; }
cd benchmarks
timeout ${E_LIMIT:-300} python3 end_rule.py --device cuda --model /tmp/bm/bench --draft-model /tmp/bm/bench-eagle3 \
  --rule least --method eagle3:3 --batch 8 --prompts 8 --max-tokens 128 --temperature 0 0.8 \
  --workload repeated completion --repeats ${REPEATS:-8} > $OUT/end-rule-eagle3.txt 2>&1
echo "eagle3 rc $?"; tail -12 $OUT/end-rule-eagle3.txt
timeout ${N_LIMIT:-240} python3 end_rule.py --device cuda --model /tmp/bm/bench --rule least --method ngram:4 --batch 8 \
  --prompts 8 --max-tokens 128 --temperature 0 0.8 --workload repeated completion --repeats ${REPEATS:-8} \
  > $OUT/end-rule-ngram.txt 2>&1
echo "ngram rc $?"; tail -12 $OUT/end-rule-ngram.txt
