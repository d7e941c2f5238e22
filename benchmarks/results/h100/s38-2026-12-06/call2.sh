# s38 call 2 (issue 28, the few-row kernel): the whole CUDA suite with the bench target's build beside it (BACKGROUND),
# then ngram and suffix over the fused baseline with the few-row kernel on (FEW_ROWS 8) and off (1), batch 1, greedy,
# then the projection timings (rows_linear.py) and whole verify steps (target_linear.py) with what time is left.
# Outputs: $OUT/suite-top.txt, gc.tgz (the suite's logs), mx.tgz (the measurements).
set -u
T0=$SECONDS
END=${END:-575}
left() { echo $(( END - (SECONDS - T0) )); }
mkdir -p /tmp/gc /tmp/mx
SHARDS=8 SHARD_THREADS=2 SUITE_LIMIT=${SUITE_LIMIT:-300} OUT=/tmp/gc \
  BACKGROUND="python3 -m specdec.zoo --preset bench --out /tmp/bm/bench --device cuda" \
  bash benchmarks/gpu_check.sh > $OUT/suite-top.txt 2>&1
tail -16 $OUT/suite-top.txt
tar czf $OUT/gc.tgz -C /tmp gc
echo "suite and build done at $((SECONDS - T0)) s"
export PYTHONPATH=$PWD/.device-pkgs
cd benchmarks
if [ -f /tmp/bm/bench/config.json ]; then
  for few in 8 1; do
    L=$(( $(left) - 60 )); [ $L -gt 120 ] && L=120
    [ $L -lt 20 ] && break
    timeout $L python3 -c "import sys; import specdec.fused as f; f.FEW_ROWS = $few; sys.argv = ['e2e.py'] + sys.argv[1:]
import e2e; raise SystemExit(e2e.main())" --device cuda --model /tmp/bm/bench --no-peers --no-plots --no-progress \
      --temperature 0 --batch 1 --prompts 4 --max-tokens 128 --repeats 3 --out /tmp/mx --name methods-few$few \
      --methods ngram:4@fixed suffix:4@fixed > /tmp/mx/methods-few$few.log 2>&1
    echo "few $few rc $? at $((SECONDS - T0)) s"
    grep "^|" /tmp/mx/methods-few$few.md | head -12
  done
fi
L=$(( $(left) - 40 )); [ $L -gt 100 ] && L=100
[ $L -gt 20 ] && timeout $L python3 rows_linear.py --sizes bench 1b 3b --rows 1 4 6 8 \
  --variants dot16x128 dot16x256 dot32x128 sum128 sum256 --out /tmp/mx > /tmp/mx/rows.txt 2>&1
echo "rows rc $? at $((SECONDS - T0)) s"; grep -o '"size[^}]*' /tmp/mx/rows.txt | cut -c1-220 | head -40
L=$(( $(left) - 10 ))
[ $L -gt 20 ] && timeout $L python3 target_linear.py --sizes bench 1b --batch 1 --q 4 6 --modes one fused fused-sum \
  cublas --rounds 1 --replays 20 --out /tmp/mx > /tmp/mx/target.txt 2>&1
echo "target rc $? at $((SECONDS - T0)) s"; tail -5 /tmp/mx/target.txt | cut -c1-400
tar czf $OUT/mx.tgz -C /tmp mx
