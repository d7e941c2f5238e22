cd benchmarks && python3 -c "from gpu_eagle_profile import random_bench; print(random_bench('/tmp/rb', 'eagle3'))"
