set -x
t0=$SECONDS
python3 -m specdec.zoo --preset bench --out /tmp/bm/bench --device cuda > $OUT/build.log 2>&1; echo "build rc $? at $((SECONDS-t0)) s"
grep "saved to" $OUT/build.log | head -2
python3 -m specdec_eagle.train_bundled --target /tmp/bm/bench --device cuda --batch-size 16 --seq-len 1024 --site-packages --out /tmp/bm/bench-eagle3 --megabytes 24 --steps 600 --lr 2e-3 --draft-vocab-size 8192 > $OUT/eagle-train.log 2>&1; echo "eagle3 rc $? at $((SECONDS-t0)) s"
tail -2 $OUT/eagle-train.log
