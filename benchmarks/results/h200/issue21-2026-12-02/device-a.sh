#!/usr/bin/env bash
# Call A: the whole suite (CUDA tests included) in 4 shards while the bench pair trains beside it, then the
# Triton rotary capture check. Everything lands in /tmp/gc (kept on the machine for call B), packed into $OUT.
REAL=$OUT
export OUT=/tmp/gc
rm -rf /tmp/gc; mkdir -p $OUT
BACKGROUND="timeout 480 python3 -m specdec.zoo --preset bench bench-draft --out /tmp/bm --device cuda" \
RUN_AFTER="timeout 110 python3 benchmarks/gpu_rope_capture.py --timeout 35" \
AFTER_LIMIT=120 AFTER_TAIL=25 SKIP_AFTER=470 SHARDS=4 SUITE_LIMIT=260 BG_TAIL=8 \
  bash benchmarks/gpu_check.sh 2>&1 | tee /tmp/gc/console.log
ls /tmp/bm/bench /tmp/bm/bench-draft 2>&1 | head -20
tar czf $REAL/gc.tgz -C /tmp gc
cp /tmp/bm/bench/README.md $REAL/bench-card.md 2>/dev/null; cp /tmp/bm/bench-draft/README.md $REAL/bench-draft-card.md 2>/dev/null
ls -la $REAL
