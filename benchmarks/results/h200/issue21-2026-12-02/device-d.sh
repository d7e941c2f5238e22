#!/usr/bin/env bash
# Call D (fresh machine, ~300 s of device time left): the eagle chain's cost per KV bucket and its kernels;
# extraction at steady state (384 x 1024 tokens, ~12 shards a pass) on the disk and in RAM; the eagle tests
# fixed after call A. Results packed into $OUT/d.tgz after every stage.
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
D=/tmp/d; mkdir -p $D
pack() { tar czf $OUT/d.tgz -C /tmp d; }
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- '-e %s ' plugins/*/) > $D/install.log 2>&1
timeout 70 python3 benchmarks/gpu_eagle_profile.py --random-bench /tmp/rb -k 5 --top 25 --chain-buckets > $D/profile.log 2>&1
grep -E "propose calls|tok/s\)|a replay" $D/profile.log; pack
df -B1 --output=avail /dev/shm | tail -1 > $D/shm.txt
for root in /tmp $( [ "$(cat $D/shm.txt)" -gt 8000000000 ] && echo /dev/shm ); do
  timeout 60 python3 benchmarks/bench_extract.py --device cuda --batch 16 --sequences 384 --seq-len 1024 --layers 2 6 9 \
      --last --repeats 1 --shard-root $root --out $D/extract-$(basename $root).json > $D/extract-$(basename $root).log 2>&1
  echo "extract under $root rc $?"; grep -E "GB/s|^\| 16" $D/extract-$(basename $root).log; pack
done
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/plugins/eagle/test_eagle.py tests/plugins/eagle/test_eagle_chain.py \
    tests/plugins/eagle/test_eagle_graph_chain.py > $D/eagle-tests.log 2>&1
echo "eagle tests rc $?: $(tail -n 1 $D/eagle-tests.log)"; grep -h "^FAILED" $D/eagle-tests.log | head; pack
