cd benchmarks
for w in repeated:24 completion:16 short:8; do
  name=${w%%:*}; n=${w##*:}
  timeout 75 python3 plain_overhead.py --device cuda --random-bench /tmp/rb --methods eagle3:3 --batch 8 --temperature 0 --workload $name --prompts $n --repeats 3 --host-timers --out $OUT/po-$name.json > $OUT/po-$name.log 2>&1; echo "$name rc $?"
  grep -v -e Capturing -e Loading $OUT/po-$name.log | tail -32
done
