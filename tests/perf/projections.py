"""The layers' projection products, cuBLAS against the split-TF32 kernel, side by side in one process.

    python tests/perf/projections.py [--rows 1048576] [--features 128] [--counts 1,2,4] [--json]

For each number of projections of one x [rows, features] (TransformerConv
has 4, GATv2Conv 2), times ops.dense's three products with each
implementation (CUDA events, median of --repeat after warm-up): the forward
(x @ W_i^T + b_i), the input gradient (sum g_i @ W_i) and the weight and bias
gradients (g_i^T @ x, column sums of g_i). Also the largest error of each
forward against fp64 on the first 4,096 rows. Needs a GPU and the native
extension.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from unittest import mock

import torch

from gnnio_cli.bench.timing import time_call
from gnnio_cli.ops import dense

PRODUCTS = ("forward", "input gradient", "weight and bias gradients")
CHECKED_ROWS = 4096


def _matmul_choice(choice: str):
    """GNNIO_FP32_MATMUL=choice inside the block (ops.dense reads it per product), restored after."""
    return mock.patch.dict(os.environ, {dense.MATMUL_ENV: choice})


def measure(rows: int, features: int, count: int, repeat: int, device: torch.device) -> dict:
    """ms per product for both implementations, and each forward's error against fp64."""
    generator = torch.Generator(device=device).manual_seed(count)
    x = torch.randn(rows, features, device=device, generator=generator)
    weights = [
        torch.randn(features, features, device=device, generator=generator) / features**0.5 for _ in range(count)
    ]
    biases = [torch.randn(features, device=device, generator=generator) for _ in range(count)]
    grads = [torch.randn(rows, features, device=device, generator=generator) for _ in range(count)]
    needed = [True] * count
    calls = {
        "forward": lambda: dense.project(x, weights, biases),
        "input gradient": lambda: dense.project_input_gradient(grads, weights),
        "weight and bias gradients": lambda: dense.project_parameter_gradients(grads, x, needed, needed),
    }
    exact = x[:CHECKED_ROWS].double() @ weights[0].double().t() + biases[0].double()
    result = {"projections": count, "rows": rows, "features": features}
    for choice in ("cublas", "split-tf32"):
        with _matmul_choice(choice), torch.no_grad():
            result[choice] = {name: time_call(call, device, repeat=repeat).median_ms for name, call in calls.items()}
            first = dense.project(x[:CHECKED_ROWS], weights[:1], biases[:1])[0]
            result[choice]["forward error"] = (first.double() - exact).abs().max().item()
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1 << 20)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--counts", default="1,2,4", help="numbers of projections, comma-separated")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print one JSON document and nothing else")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gnnio.bench.projections: needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    results = [measure(args.rows, args.features, int(count), args.repeat, device) for count in args.counts.split(",")]
    if args.json:
        print(json.dumps({"results": results}, indent=1))
        return 0
    print(f"x [{args.rows}, {args.features}] fp32; ms, cublas / split-tf32 (speedup)")
    for result in results:
        for product in PRODUCTS:
            cublas, split = result["cublas"][product], result["split-tf32"][product]
            print(f"{result['projections']} projection(s)  {product:26s} "
                  f"{cublas:7.3f} / {split:7.3f}  ({cublas / split:4.2f}x)")
        print(f"{result['projections']} projection(s)  forward error against fp64: "
              f"cublas {result['cublas']['forward error']:.3g}, split-tf32 {result['split-tf32']['forward error']:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
