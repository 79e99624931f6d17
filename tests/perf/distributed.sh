#!/usr/bin/env bash
# The multi-GPU acceptance set, on one host with 4 GPUs (NCCL), for a 2-layer GATv2 training step (128 features,
# 4 heads, partitions of the ids as generated, or in ORDER's order: on R-MAT graphs rcm makes a larger halo and
#   puts most of the traffic on one rank):
#   - outputs and gradients of every layer kind on 2 and 4 GPUs equal one GPU's (the NCCL tests, rmat20 included);
#   - weak scaling: rmat20 on 1 GPU, rmat21 on 2, rmat22 on 4 (efficiency = time on 1 / time on P, >= 0.75 on 4);
#   - strong scaling: rmat22 on 1, 2 and 4 GPUs (>= 2.8x on 4);
#   - rmat24 on 4 GPUs (step time, peak memory per rank) against the same model on one GPU, every GPU capped at
#     80 GiB (--gpu-memory) as an 80 GB GPU holds: out of memory on one.
# The graphs are generated and partitioned on the CPU while the NCCL tests and the smaller runs use the GPUs.
#
#   tests/perf/distributed.sh OUT_DIR          (ORDER=rcm tests/perf/distributed.sh OUT_DIR: partitions after an rcm order)
#
# OUT_DIR gets the graphs, one JSON document per run (gnnio run --json), the tests' log and summary.txt.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:?usage: tests/perf/distributed.sh OUT_DIR}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
cd "$OUT"
gnnio() { python -m gnnio_cli "$@"; }
ORDER=${ORDER:-none}
RUN=(run --layer gatv2 --features 128 --heads 4 --order "$ORDER" --warmup 2 --repeat 5 --json)

prepare() {  # one chain per graph file (a partition rewrites its graph's file); a second run reuses both
  local scale=$1; shift
  [ -f "rmat$scale.h5" ] || gnnio generate rmat --scale "$scale" -o "rmat$scale.h5" --quiet
  for parts in "$@"; do
    gnnio partition "rmat$scale.h5" --parts "$parts" --order "$ORDER" --json > "partition-rmat$scale-$parts.json"
  done
}
prepare 20 1 & small=($!)
prepare 21 2 & small+=($!)
prepare 22 4 2 & small+=($!)
prepare 24 4 & large=$!

(cd "$REPO" && python -m pytest tests/test_distributed.py -k nccl -q -p no:cacheprovider) > nccl-equality.log 2>&1 \
  || echo "the NCCL equality tests failed: see $OUT/nccl-equality.log"
tail -n 3 nccl-equality.log
for pid in "${small[@]}"; do wait "$pid"; done

# (rmat24 is still being generated and partitioned on the CPU meanwhile)
gnnio "${RUN[@]}" --graph rmat20.h5 --gpus 1 > run-rmat20-1.json                # its baseline: 1 GPU, weak scaling
gnnio "${RUN[@]}" --graph rmat21.h5 --gpus 2 --no-baseline > run-rmat21-2.json
gnnio "${RUN[@]}" --graph rmat22.h5 --gpus 4 > run-rmat22-4.json                # its baseline: 1 GPU, strong scaling
gnnio "${RUN[@]}" --graph rmat22.h5 --gpus 2 --no-baseline > run-rmat22-2.json
wait "$large"
gnnio "${RUN[@]}" --graph rmat24.h5 --gpus 4 --gpu-memory 80 > run-rmat24-4.json

python - <<'EOF' | tee summary.txt
import json

def load(name):
    with open(f"run-{name}.json") as file:
        return json.load(file)

def step(document):
    return document["total"]["step_ms"]

def baseline(document):
    return document["baseline"].get("step_ms", {}).get("median_ms")

def mib(value):
    return "n/a" if value is None else f"{value:.0f} MiB"

runs = {name: load(name) for name in ("rmat20-1", "rmat21-2", "rmat22-4", "rmat22-2", "rmat24-4")}
for name, document in runs.items():
    total = document["total"]
    print(f"{name}: step {step(document):.2f} ms; halo exchange {total['halo_exchange_ms_max']:.2f} ms, exposed "
          f"{total['halo_exposed_ms_max']:.2f} ms (slowest rank); halo {total['halo_bytes_per_step'] / 1e6:.1f} MB/step")
    for rank in document["ranks"]:
        print(f"  rank {rank['rank']}: {rank['nodes']} nodes ({rank['interior_nodes']} interior), {rank['edges']} edges, "
              f"{rank['halo_nodes']} halo; step {rank['step_ms']['median_ms']:.2f} ms, exchange "
              f"{rank['halo_exchange_ms']:.2f} ms ({rank['halo_exposed_ms']:.2f} exposed), all-reduce "
              f"{rank['allreduce_ms']:.2f} ms, peak {mib(rank['peak_mib'])}")
weak_one = baseline(runs["rmat20-1"])
strong_one = baseline(runs["rmat22-4"])
print(f"weak scaling (1 GPU rmat20 {weak_one:.2f} ms): efficiency on 2 {weak_one / step(runs['rmat21-2']):.3f}, "
      f"on 4 {weak_one / step(runs['rmat22-4']):.3f} (bound 0.75 on 4)")
print(f"strong scaling (1 GPU rmat22 {strong_one:.2f} ms): speedup on 2 {strong_one / step(runs['rmat22-2']):.2f}x, "
      f"on 4 {strong_one / step(runs['rmat22-4']):.2f}x (bound 2.8x on 4)")
single = runs["rmat24-4"]["baseline"]
print(f"rmat24 on 4 GPUs: step {step(runs['rmat24-4']):.2f} ms, peak per rank "
      f"{', '.join(mib(rank['peak_mib']) for rank in runs['rmat24-4']['ranks'])}; on 1 GPU: "
      + (single["error"] if "error" in single else f"{baseline(runs['rmat24-4']):.2f} ms")
      + f", peak {mib(single['peak_mib'])}")
EOF
