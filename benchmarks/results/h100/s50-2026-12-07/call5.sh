# s50 call 5 (fresh machine): where medusa's seeded drafting step goes at batch 8 (random-init bench-shaped pair,
# fixed k=2, 64 tokens): T = 0.8 seeded against greedy, device kernels and host timers.
export PYTHONPATH=$PWD/.device-pkgs PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . $(printf -- "-e %s " plugins/*/) > /tmp/install.log 2>&1
d=$OUT/medusa-keyed; mkdir -p $d
for t in 0.8 0; do
  timeout 110 python3 benchmarks/gpu_step_trace.py --random-bench /tmp/rb --methods medusa:2 --batch 8 --max-tokens 64 \
    --temperature $t --seed 1 --host-timers --out $d/t$t > $d/t$t.log 2>&1
  echo "T=$t rc $?"
done
find $d -name "trace-*.json.gz" -delete
for f in $d/*.log; do echo "## $f"; grep -v "Loading\|Writing\|USDT" $f | cut -c1-150 | head -40; done
