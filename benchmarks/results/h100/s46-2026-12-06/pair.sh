# s46: the trained bench pair for call 2 (run beside the suite by call1.sh): the bench target into /tmp/bm/bench,
# then its eagle3 and medusa heads side by side (the recipes of gpu_heads.sh STAGE=trees-prep, fewer steps).
t0=$SECONDS
timeout 330 python3 -m specdec.zoo --preset bench --out /tmp/bm/bench --device cuda > $OUT/build.log 2>&1
echo "build rc $? at $((SECONDS - t0)) s"
common=(--target /tmp/bm/bench --device cuda --batch-size 16 --seq-len 1024)
timeout 120 python3 -m specdec_eagle.train_bundled "${common[@]}" --site-packages --out /tmp/bm/bench-eagle3 \
    --megabytes 24 --steps 600 --lr 2e-3 --draft-vocab-size 8192 > $OUT/eagle3-train.log 2>&1 &
timeout 120 python3 -m specdec_medusa.train_bundled "${common[@]}" --out /tmp/bm/bench-medusa --megabytes 16 \
    --steps 500 --num-heads 4 --draft-vocab-size 0 --no-fp16 > $OUT/medusa-train.log 2>&1 &
wait
echo "heads at $((SECONDS - t0)) s"; ls /tmp/bm
for h in eagle3 medusa; do echo "$h: $(tr '\r' '\n' < $OUT/$h-train.log | grep -v "^train\|Loading" | tail -1)"; done
