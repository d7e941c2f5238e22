#!/usr/bin/env bash
# Call C (fresh machine): where an eagle step's time goes (random bench-shaped target and head), extraction
# throughput (issue 20), then batch 32 old against new (issue 19). Everything in /tmp/gc, packed into $OUT.
REAL=$OUT
export OUT=/tmp/gc
rm -rf /tmp/gc; mkdir -p $OUT
RUN_AFTER="timeout 60 python3 benchmarks/gpu_eagle_profile.py --random-bench /tmp/rb -k 5 --top 40 > /tmp/gc/profile.log 2>&1; grep -A2 'propose calls' /tmp/gc/profile.log; timeout 110 python3 benchmarks/bench_extract.py --device cuda --batch 4 16 --sequences 64 --seq-len 1024 --layers 2 6 9 --last --repeats 2 --out /tmp/gc/extract.json" \
AFTER_LIMIT=180 AFTER_TAIL=14 SUITE=0 OLD_TREE=.old-tree B32_LIMIT=185 \
  bash benchmarks/gpu_check.sh 2>&1 | tee /tmp/gc/console.log
rm -rf /tmp/gc/b32-*/*.png
tar czf $REAL/gc.tgz -C /tmp gc
ls -la $REAL
