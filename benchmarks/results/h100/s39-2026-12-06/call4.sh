# s39 call 4: the whole CUDA suite on the session's final library (the few-row kernel removed), then how noisy a
# batch-8 pass is on this machine (two identical baseline engines, torch's 16 threads and 1) and what a plain step
# costs a method's engine against the baseline's (random bench-shaped pair, e2e's repeated prompts).
export PYTHONPATH=$PWD/.device-pkgs
nvidia-smi --query-gpu=name --format=csv,noheader
SHARDS=8 SHARD_THREADS=2 SUITE_LIMIT=300 OUT=/tmp/gc bash benchmarks/gpu_check.sh > $OUT/suite-console.log 2>&1
tail -9 $OUT/suite-console.log
tar czf $OUT/gc.tgz -C /tmp gc
cd benchmarks
python3 -c "from gpu_eagle_profile import random_bench; random_bench('/tmp/rb')" > $OUT/rb.log 2>&1
for th in 16 1; do
  timeout 45 python3 noise_floor.py --device cuda --model /tmp/rb/target --batch 8 --prompts 64 --max-tokens 128 \
    --rounds 8 --threads $th 2>&1 | tail -1 | tee -a $OUT/noise.txt
done
timeout 100 python3 plain_overhead.py --device cuda --random-bench /tmp/rb --methods ngram:4 eagle3:3 --batch 8 \
  --temperature 0 --workload repeated --prompts 64 --repeats 5 --out $OUT/plain-overhead.json > $OUT/plain-overhead.txt 2>&1
echo "plain_overhead rc $?"; tail -12 $OUT/plain-overhead.txt
