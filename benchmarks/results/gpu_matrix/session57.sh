#!/usr/bin/env bash
# Session 57's device commands, in the repository root of the GPU machine (session 57 ran the
# matrix cells' first definition: gpu_matrix.md, "Session 57"; this is the next session's).
#   phase 1 (tree leaned by lean_tree.sh; carry .whl data/c10): the wheels and hwnas installed,
#     the full CIFAR-10 npz kept in /tmp/full for phase 2, then the GPU matrix's search cells
#     (the run cells they need first) -> $OUT/gpu_matrix.json
#   phase 2 (lean_tree.sh supernet/checkpoints/mbv3_cifar10.pt
#     benchmarks/results/search_joint/cifar10_work.tgz; at once, on the machine of phase 1):
#     issue 47.2's CIFAR-10 mbv3 joint table, built on the GPU by 8 shards, resumed from
#     cifar10_work.tgz where /tmp has none -> $OUT/joint_work.tgz (commit it as that file; the
#     table and its record are in it once done)
set -u
PHASE=$1; S=${2:-540}; T0=$(date +%s)
left() { echo $(( S - ($(date +%s) - T0) )); }
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
if [ "$PHASE" = 1 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
  mkdir -p /tmp/full/cifar10 /tmp/res && cp data/c10/cifar10-jpeg.npz /tmp/full/cifar10/
  timeout $(( $(left) - 20 )) python3 benchmarks/gpu_matrix.py --out /tmp/res --budget-s 300 \
    --cell-timeout 280 --jobs 3 --work /tmp/gm --results benchmarks/gpu_matrix.json \
    --only search/ 2>&1 | tail -12
  cp /tmp/res/gpu_matrix.* "$OUT/"
  exit 0
fi
# phase 2
[ -f /tmp/full/cifar10/cifar10-jpeg.npz ] || { echo "no /tmp/full: a fresh machine, run phase 1 first"; exit 1; }
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
W=/tmp/jw; mkdir -p $W
# the last command's partial CSVs (carried: lean_tree.sh benchmarks/results/search_joint/cifar10_work.tgz ...)
[ -f benchmarks/results/search_joint/cifar10_work.tgz ] && [ ! -f $W/seeds-6a52e085aa0c.json ] && tar -xzf benchmarks/results/search_joint/cifar10_work.tgz -C $W
export HWNAS_SHARED_DATA=/tmp/full OMP_NUM_THREADS=2
J=(python3 benchmarks/search_joint.py --build-table --supernet supernet/checkpoints/mbv3_cifar10.pt
   --space mbv3 --dataset cifar10 --objectives accuracy,latency:fpga-zcu102-est,size
   --devices edgetpu-est jetson-orin-nano-est --torch-device cuda --archs 500 --policies 4
   --work $W --table $W/table.csv.gz --quiet)
s0=$(date +%s); "${J[@]}" --max-minutes 0.0001 2>&1 | tail -2; echo "seeds: $(( $(date +%s) - s0 )) s"
M=$(( ($(left) - 60) / 60 ))
for i in 0 1 2 3 4 5 6 7; do "${J[@]}" --shard $i/8 --max-minutes $M > /tmp/shard$i.log 2>&1 & done
wait
tail -n 3 /tmp/shard*.log | cut -c1-200
cat $W/*.csv | wc -l
tar -czf "$OUT/joint_work.tgz" -C $W .
ls -la "$OUT"
