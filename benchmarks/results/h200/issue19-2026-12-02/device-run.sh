#!/usr/bin/env bash
# This session's one device call (not committed): everything lands in /tmp/gc, packed into $OUT/gc.tgz.
REAL=$OUT
export OUT=/tmp/gc
mkdir -p $OUT
BACKGROUND="timeout 240 python3 -m specdec.zoo --preset tiny tiny-draft --out /tmp/gc/models --device cuda" \
RUN_AFTER="timeout 100 python3 benchmarks/gpu_rope_capture.py --timeout 30; timeout 45 python3 benchmarks/bench_extract.py --device cuda --batch 4 16 --sequences 64 --seq-len 1024 --layers 2 6 9 --last --out /tmp/gc/extract.json" \
AFTER_LIMIT=150 AFTER_TAIL=60 SKIP_AFTER=330 OLD_TREE=.old-tree B32_LIMIT=45 SHARDS=4 SUITE_LIMIT=225 \
  bash benchmarks/gpu_check.sh 2>&1 | tee /tmp/gc/console.log
rm -rf /tmp/gc/b32-*/*.png
tar czf $REAL/gc.tgz -C /tmp gc
ls -la $REAL
