"""Convert throughput: `gnnio convert` against pandas.read_csv on the same text.

Writes the R-MAT graph of the given scale (rmat20 by default: about 16M edges)
as a SNAP-style text edge list in a temporary folder, then times, alternately
and in one process, pandas.read_csv (C engine) merely parsing the file and
gnnio's full conversion of it (parse, ids, dedup, CSR+CSC, atomic .h5 write).
Reports the medians and their ratio (acceptance, issue 2: at most 2). The
conversion's peak memory is measured once more through the real entry point
in a child process and set against the size of the arrays in the .h5.

    python tests/perf/convert_throughput.py [--scale 20] [--repeat 3] [--json]

pandas is needed only here; it is not a dependency of gnnio.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from gnnio_cli.cli import output
from gnnio_cli.graph import store
from gnnio_cli.graph.convert import ConvertOptions, convert_file
from gnnio_cli.graph.generate import generate_standard
from gnnio_cli.graph.io import read_edges, write_edge_list

BOUND = 2.0


@dataclass
class ThroughputResult:
    graph: str
    file_bytes: int
    nodes: int
    edges: int
    pandas_parse_s: list = field(default_factory=list)
    gnnio_parse_s: list = field(default_factory=list)
    gnnio_convert_s: list = field(default_factory=list)
    pandas_parse_cpu_s: list = field(default_factory=list)
    gnnio_convert_cpu_s: list = field(default_factory=list)
    ratio_convert_to_pandas: float = 0.0
    cpu_ratio_convert_to_pandas: float = 0.0
    convert_stage_s: dict = field(default_factory=dict)
    output_dir: str = ""
    load_average: list = field(default_factory=list)
    bound: float = BOUND
    passed: bool = False
    cli_convert_s: float = 0.0
    cli_peak_rss_bytes: int = 0
    cli_baseline_rss_bytes: int = 0
    h5_array_bytes: int = 0
    machine: str = ""


def pandas_parse(path: Path):
    import pandas

    frame = pandas.read_csv(
        path, sep="\t", comment="#", header=None, names=["src", "dst"], dtype=np.int64, engine="c"
    )
    return frame["src"].to_numpy(), frame["dst"].to_numpy()


def _timed(func, cpu_seconds: Optional[list] = None) -> float:
    """Wall seconds of func(); its process CPU seconds (all threads) appended to `cpu_seconds`."""
    cpu_started = time.process_time()
    started = time.perf_counter()
    func()
    seconds = time.perf_counter() - started
    if cpu_seconds is not None:
        cpu_seconds.append(time.process_time() - cpu_started)
    return seconds


# Runs a gnnio command line, then prints the process's peak RSS (VmHWM, in
# kB) as the last line. VmHWM belongs to the address space made at exec, so
# unlike getrusage it does not count the parent's memory the fork shared.
_PEAK_RSS_CHILD = """
import sys
from gnnio_cli.cli import main
if sys.argv[1:]:
    main(sys.argv[1:])
else:
    import gnnio_cli.cli.convert
status = open("/proc/self/status").read().split("VmHWM:")[1]
print(int(status.split()[0]))
"""


def _child_peak_rss(gnnio_args: list[str]) -> tuple[float, int]:
    """(seconds, peak RSS in bytes) of `gnnio <gnnio_args>` in a child
    process; no arguments: just the interpreter and gnnio's imports."""
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", _PEAK_RSS_CHILD, *gnnio_args], check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    return seconds, int(run.stdout.split()[-1]) * 1024


def _h5_array_bytes(path: Path) -> int:
    import h5py

    total = 0
    with h5py.File(path, "r") as h5:

        def add(_, item):
            nonlocal total
            if isinstance(item, h5py.Dataset):
                total += item.size * item.dtype.itemsize

        h5.visititems(add)
    return total


class StageClock:
    """A convert_file progress callback that notes when each stage starts."""

    def __init__(self):
        self.starts: list[tuple[str, float]] = []

    def __call__(self, stage: str) -> None:
        self.starts.append((stage, time.perf_counter()))

    def durations(self) -> dict[str, float]:
        """Seconds from each stage's start to the next one's (the last: to now)."""
        ends = [start for _, start in self.starts[1:]] + [time.perf_counter()]
        return {stage: end - start for (stage, start), end in zip(self.starts, ends)}


def measure(scale: int, repeat: int, folder: Path, output_folder: Optional[Path] = None) -> ThroughputResult:
    """Time both contenders on rmat<scale> written as text in `folder`; the
    .h5 goes to `output_folder` (default: `folder`)."""
    name = f"rmat{scale}"
    generated = generate_standard(name)
    graph = generated.stored.graph
    text = folder / f"{name}.txt"
    edge_index = graph.edge_index().numpy()
    # Shuffled, as an edge list from elsewhere would be: the converter must sort it.
    order = np.random.default_rng(1).permutation(graph.num_edges)
    write_edge_list(text, edge_index[0][order], edge_index[1][order], graph.num_nodes, title=name)
    del generated, graph, edge_index, order

    # Warm-up on a small file: numba's compiled kernels load once per process.
    small = folder / "warmup.txt"
    write_edge_list(small, np.arange(1000), np.arange(1, 1001), 1001)
    convert_file(str(small), folder / "warmup.h5", force=True)
    pandas_parse(small)

    h5 = (output_folder or folder) / f"{name}.h5"
    _, baseline_rss = _child_peak_rss([])
    cli_s, cli_rss = _child_peak_rss(["convert", str(text), "-o", str(h5), "--force", "--quiet"])

    result = ThroughputResult(
        graph=name,
        file_bytes=text.stat().st_size,
        nodes=0,
        edges=0,
        cli_convert_s=cli_s,
        cli_peak_rss_bytes=cli_rss,
        cli_baseline_rss_bytes=baseline_rss,
        h5_array_bytes=_h5_array_bytes(h5),
        machine=f"{platform.node()} {platform.processor() or platform.machine()}",
    )
    for _ in range(repeat):
        result.pandas_parse_s.append(_timed(lambda: pandas_parse(text), result.pandas_parse_cpu_s))
        result.gnnio_parse_s.append(_timed(lambda: read_edges(str(text))))
        stages = StageClock()
        result.gnnio_convert_s.append(
            _timed(lambda: convert_file(str(text), h5, ConvertOptions(), force=True, progress=stages), result.gnnio_convert_cpu_s)
        )
        for stage, seconds in stages.durations().items():
            result.convert_stage_s.setdefault(stage, []).append(seconds)
    attrs = store.read_attrs(h5)
    result.nodes, result.edges = int(attrs["num_nodes"]), int(attrs["num_edges"])
    result.ratio_convert_to_pandas = statistics.median(result.gnnio_convert_s) / statistics.median(result.pandas_parse_s)
    result.cpu_ratio_convert_to_pandas = statistics.median(result.gnnio_convert_cpu_s) / statistics.median(
        result.pandas_parse_cpu_s
    )
    result.load_average = [round(value, 2) for value in os.getloadavg()]
    result.passed = result.ratio_convert_to_pandas <= BOUND
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=20, help="R-MAT scale (20: about 16M edges)")
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds of each contender")
    parser.add_argument("--json", action="store_true", help="print the result as JSON only")
    parser.add_argument(
        "--output-dir",
        type=Path,
        help="where the .h5 is written (default: the temporary folder beside the text file); "
        "a tmpfs such as /dev/shm separates the file system's write cost from gnnio's own",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gnnio-convert-bench-") as folder, tempfile.TemporaryDirectory(
        prefix="gnnio-convert-bench-", dir=args.output_dir or folder
    ) as output_folder:
        result = measure(args.scale, args.repeat, Path(folder), Path(output_folder))
    result.output_dir = str(args.output_dir) if args.output_dir else "temporary folder (disk)"
    if args.json:
        output.emit_json(result)
        return
    mib = 1 << 20
    rows = [
        ("graph", result.graph),
        (".h5 written to", result.output_dir),
        ("text file (MiB)", round(result.file_bytes / mib, 1)),
        ("nodes", result.nodes),
        ("edges", result.edges),
        ("pandas.read_csv parse, median (s)", round(statistics.median(result.pandas_parse_s), 3)),
        ("gnnio parse only, median (s)", round(statistics.median(result.gnnio_parse_s), 3)),
        ("gnnio convert to .h5, median (s)", round(statistics.median(result.gnnio_convert_s), 3)),
        ("ratio convert / pandas", round(result.ratio_convert_to_pandas, 3)),
        (f"within {BOUND}x", result.passed),
        ("CPU seconds ratio (all threads)", round(result.cpu_ratio_convert_to_pandas, 3)),
        *(
            (f"  convert stage '{stage}', median (s)", round(statistics.median(seconds), 3))
            for stage, seconds in result.convert_stage_s.items()
        ),
        ("load average 1/5/15 min after", " / ".join(str(v) for v in result.load_average)),
        ("CLI convert, child process (s)", round(result.cli_convert_s, 3)),
        ("CLI peak RSS (MiB)", round(result.cli_peak_rss_bytes / mib)),
        ("  of which interpreter + imports (MiB)", round(result.cli_baseline_rss_bytes / mib)),
        ("arrays in the .h5 (MiB)", round(result.h5_array_bytes / mib)),
    ]
    output.stdout.print(output.key_value_table("convert throughput", rows))


if __name__ == "__main__":
    main()
