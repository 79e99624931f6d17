"""gnnio's kernel switches timed side by side, in one process.

A few environment settings choose among gnnio's kernels (GNNIO_SPMM_KERNEL,
GNNIO_EXTREMUM_KERNEL, GNNIO_FP32_MATMUL). This times each layer's
aggregation under each variant, the variants interleaved round by round, so
that what drifts between machines and over a run falls on all of them alike:
a change to a kernel is judged by its ratio to the variant it replaces, not
by absolute times from different runs.

    python tests/perf/switches.py --graph rmat20 --layer gat,transformer \\
        --variant GNNIO_FP32_MATMUL=cublas --variant GNNIO_FP32_MATMUL=split-tf32

A variant is a space-separated list of NAME=VALUE settings ("" leaves the
environment as it is).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from gnnio_cli.bench import workloads
from gnnio_cli.bench.timing import time_call
from gnnio_cli.errors import GnnioError
from gnnio_cli.graph import catalog
from gnnio_cli.native import environment  # the variants' settings, restored after each


def parse_variant(text: str) -> dict[str, str]:
    """'A=1 B=0' -> {'A': '1', 'B': '0'}; a one-line error for anything else."""
    settings = {}
    for item in text.split():
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise GnnioError(f"--variant {text!r}: expected NAME=VALUE settings separated by spaces, got {item!r}")
        settings[name] = value
    return settings


def time_variants(forward, variants: list[str], device: torch.device, *, rounds: int, repeat: int) -> list[dict]:
    """Median forward ms of `forward` under each variant over `rounds` interleaved rounds of `repeat` calls."""
    samples = {variant: [] for variant in variants}
    for _ in range(rounds):
        for variant in variants:
            with environment(parse_variant(variant)):
                timing = time_call(forward, device, warmup=2, repeat=repeat)
            samples[variant].append(timing.median_ms)
    first = statistics.median(samples[variants[0]])
    rows = []
    for variant in variants:
        median = statistics.median(samples[variant])
        rows.append({"variant": variant, "forward_ms": median, "round_medians_ms": samples[variant],
                     "vs_first": median / first})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default="rmat20", help="a gnnio .h5 file or a standard graph name")
    parser.add_argument("--layer", default="transformer", help="attention or aggregation layers, comma-separated")
    parser.add_argument("--dtype", default="fp32", choices=sorted(workloads.DTYPES))
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--variant", action="append", required=True, help="NAME=VALUE settings, space-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    try:
        if args.rounds < 1 or args.repeat < 1:
            raise GnnioError(f"--rounds and --repeat must be at least 1, got {args.rounds} and {args.repeat}")
        for variant in args.variant:
            parse_variant(variant)
        if not torch.cuda.is_available():
            raise GnnioError("the switches bench times the CUDA kernels, and no GPU is visible to torch")
        device = torch.device("cuda")
        named = catalog.resolve(args.graph)
        results = []
        for layer in [item.strip() for item in args.layer.split(",") if item.strip()]:
            settings = workloads.Settings(layer=layer, features=args.features, heads=args.heads, dtype=args.dtype,
                                          device="cuda")
            workload = workloads.op_workload(named.graph, settings)
            with torch.no_grad():
                rows = time_variants(workload.forward, args.variant, device, rounds=args.rounds, repeat=args.repeat)
            results.append({"layer": layer, "dtype": args.dtype, "variants": rows})
            del workload
            torch.cuda.empty_cache()
    except GnnioError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for result in results:
        for row in result["variants"]:
            print(f"{result['layer']:12} {result['dtype']:5} {row['forward_ms']:8.3f} ms  x{row['vs_first']:.3f}  "
                  f"{row['variant'] or '(as is)'}")
    if args.out is not None:
        args.out.write_text(json.dumps({"graph": args.graph, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
