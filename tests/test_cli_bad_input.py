"""Bad input across every subcommand: one line on stderr, a non-zero exit, nothing changed.

Each case is a command line with two placeholders: {inp}, the folder of
prepared inputs (malformed, damaged and unusual files, built once), and
{out}, an output file. Every case runs twice: with {out} absent and with
{out} holding a good graph. After each run: the exit status is the expected
one; stderr is exactly one line, "gnnio: error: ..." with the expected
fragment, no traceback and no "internal error"; stdout is empty; and in both
folders no file appeared (temporary files included), none disappeared and
none changed. The commands run in-process through the real `main()`, and a
few once more through the `gnnio` entry point in a subprocess.
"""

from __future__ import annotations

import gzip
import hashlib
import io as stdlib_io
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import h5py
import numpy as np
import pytest
import scipy.sparse
import torch

from gnnio_cli.graph.convert import convert_file
from testing import run_gnnio

REPO = Path(__file__).resolve().parents[1]
MTX = "%%MatrixMarket matrix coordinate pattern general\n"
GOOD_EDGES = "".join(f"{s}\t{d}\n" for s, d in [(0, 1), (1, 2), (2, 0), (2, 3), (3, 1)])

# name -> content of the text inputs
TEXT_INPUTS = {
    "good.txt": GOOD_EDGES,
    "missing_field.txt": "0 1\n2\n",
    "letters.txt": "0 1\na b\n",
    "float_id.txt": "0 1\n1.5 2\n",
    "negative.txt": "0 1\n-1 2\n",
    "huge_id.txt": "0 1\n1 123456789012345678901\n",
    "past_int64.txt": "0 1\n1 9223372036854775808\n",
    "word_weight.txt": "1 2 x\n",
    "four_fields.txt": "1 2 3 4\n",
    "extra_field.txt": "0 1\n1 2 3\n",
    "missing_weight.txt": "0 1 2.5\n1 2\n",
    "nan_weight.txt": "0 1 nan\n",
    "inf_weight.txt": "0 1 inf\n",
    "overflow_weight.txt": "0 1 1e999\n",
    "empty.txt": "",
    "comments_only.txt": "# nothing\n% here\n\n",
    "header.txt": "from to\n1 2\n",
    "nodes_contradicted.txt": "# Nodes: 2\n0 1\n1 5\n",
    "conflicting_weights.txt": "0 1 1.0\n1 2 1.0\n0 1 2.0\n",
    "crlf_missing.txt": "0 1\r\n3\r\n",
    "last_line_bad.txt": "0 1\n7 x",
    "double_comma.txt": "1,,2\n",
    "glued.txt": "1 2x\n",
    "inline_comment.txt": "0 1 # a comment\n",
    "csv_header_mismatch.csv": "src,dst\n1,2,3\n",
    "csv_bad_row.csv": "src,dst\n1,2\n3,oops\n",
    "csv_trailing_comma.csv": "1,2,\n",
    "tsv_missing.tsv": "1\t2\n3\n",
    "mtx_zero_based.mtx": MTX + "3 3 2\n1 2\n0 1\n",
    "mtx_beyond.mtx": MTX + "3 3 1\n1 4\n",
    "mtx_truncated.mtx": MTX + "3 3 5\n1 2\n2 3\n",
    "mtx_too_many.mtx": MTX + "3 3 1\n1 2\n2 3\n",
    "mtx_not_square.mtx": MTX + "3 4 1\n1 2\n",
    "mtx_array.mtx": "%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n4\n",
    "mtx_complex.mtx": "%%MatrixMarket matrix coordinate complex general\n2 2 1\n1 2 1 1\n",
    "mtx_symmetry.mtx": "%%MatrixMarket matrix coordinate pattern diagonal\n2 2 1\n1 2\n",
    "mtx_no_size.mtx": MTX + "% only comments\n",
    "mtx_bad_size.mtx": MTX + "3 3\n1 2\n",
    "mtx_real_no_value.mtx": "%%MatrixMarket matrix coordinate real general\n3 3 2\n1 2 0.5\n2 3\n",
    "mtx_pattern_value.mtx": MTX + "3 3 1\n1 2 7\n",
    "mtx_no_banner.mtx": "1 2\n",
    "mtx_in_txt.txt": MTX + "3 3 2\n1 2\n0 1\n",
    "mtx_huge.mtx": MTX + "1000000000000 1000000000000 1\n1 2\n",
    "text.npz": "0 1\n1 2\n",
    "data.txt": GOOD_EDGES,
    "notes.txt": "my own notes, not a graph\n",
}


def _sparse_npz(matrix) -> bytes:
    buffer = stdlib_io.BytesIO()
    scipy.sparse.save_npz(buffer, matrix)
    return buffer.getvalue()


def _damage(path: Path, change) -> None:
    with h5py.File(path, "r+") as h5:
        change(h5)


def _build_inputs(folder: Path) -> None:
    for name, text in TEXT_INPUTS.items():
        (folder / name).write_bytes(text.encode())
    (folder / "utf16.txt").write_bytes("0 1\n1 2\n".encode("utf-16"))
    (folder / "garbage.bin").write_bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes())
    (folder / "corrupt.txt.gz").write_bytes(gzip.compress(GOOD_EDGES.encode() * 50)[:40])
    (folder / "bad_inside.txt.gz").write_bytes(gzip.compress(b"0 1\n1 two\n"))
    (folder / "adir").mkdir()
    (folder / "empty_dir").mkdir()
    buffer = stdlib_io.BytesIO()
    np.savez(buffer, x=np.arange(3))
    (folder / "dense.npz").write_bytes(buffer.getvalue())
    (folder / "wide.npz").write_bytes(_sparse_npz(scipy.sparse.random(4, 6, density=0.5, format="csr", random_state=1)))
    (folder / "truncated.npz").write_bytes(_sparse_npz(scipy.sparse.eye(5, format="csr"))[:60])
    (folder / "complex.npz").write_bytes(_sparse_npz(scipy.sparse.eye(3, format="csr", dtype=np.complex128) * 1j))
    (folder / "zip_as_text.txt").write_bytes((folder / "dense.npz").read_bytes())
    with h5py.File(folder / "foreign.h5", "w") as h5:
        h5["x"] = np.arange(4)
    shutil.copy(folder / "foreign.h5", folder / "data.h5")  # the default output of data.txt
    convert_file(str(folder / "good.txt"), folder / "good.h5")
    damaged = {
        "version_string.h5": lambda h5: h5.attrs.__setitem__("format_version", "abc"),
        "version_newer.h5": lambda h5: h5.attrs.__setitem__("format_version", 99),
        "nodes_string.h5": lambda h5: h5.attrs.__setitem__("num_nodes", "many"),
        "params_not_json.h5": lambda h5: h5.attrs.__setitem__("params", "{oops"),
        "no_indices.h5": lambda h5: h5.__delitem__("csr/indices"),
        "inconsistent.h5": lambda h5: (h5.__delitem__("csc/indices"), h5.create_dataset("csc/indices", data=[10**6] * 3)),
        "float_indptr.h5": lambda h5: (h5.__delitem__("csr/indptr"), h5.create_dataset("csr/indptr", data=[0.5] * 5)),
    }
    for name, change in damaged.items():
        shutil.copy(folder / "good.h5", folder / name)
        _damage(folder / name, change)
    (folder / "truncated.h5").write_bytes((folder / "good.h5").read_bytes()[:600])
    (folder / "good.edges.txt").write_bytes(GOOD_EDGES.encode())


@dataclass
class Case:
    """args: the command line ({inp}: the inputs folder, {out}: the output file);
    status: the exit status; fragment: a piece of the one stderr line."""

    args: str
    status: int
    fragment: str
    stdin: Optional[bytes] = None
    without_matplotlib: bool = False


def case(id: str, args: str, status: int, fragment: str, **kwargs):
    return pytest.param(Case(args, status, fragment, **kwargs), id=id)


NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")

CASES = [
    # ----------------------------------------------------------- convert: text
    case("missing-field", "convert {inp}/missing_field.txt -o {out}", 1, "line 2: expected two node ids"),
    case("letters", "convert {inp}/letters.txt -o {out}", 1, "line 2: node ids must be integers: 'a b'"),
    case("float-id", "convert {inp}/float_id.txt -o {out}", 1, "line 2: node ids must be integers"),
    case("negative-id", "convert {inp}/negative.txt -o {out}", 1, "line 2: node ids must be non-negative"),
    case("21-digit-id", "convert {inp}/huge_id.txt -o {out}", 1, "line 2: node id larger than 2^63 - 1"),
    case("id-past-int64", "convert {inp}/past_int64.txt -o {out}", 1, "line 2: node id larger than 2^63 - 1"),
    case("word-weight", "convert {inp}/word_weight.txt -o {out}", 1, "line 1: the weight must be a finite decimal number"),
    case("four-fields", "convert {inp}/four_fields.txt -o {out}", 1, "line 1: more than three fields"),
    case("extra-field", "convert {inp}/extra_field.txt -o {out}", 1, "line 2: unexpected third field"),
    case("missing-weight", "convert {inp}/missing_weight.txt -o {out}", 1, "line 2: no weight"),
    case("nan-weight", "convert {inp}/nan_weight.txt -o {out}", 1, "line 1: the weight must be a finite"),
    case("inf-weight", "convert {inp}/inf_weight.txt -o {out}", 1, "line 1: the weight must be a finite"),
    case("overflow-weight", "convert {inp}/overflow_weight.txt -o {out}", 1, "line 1: the weight must be a finite"),
    case("empty-file", "convert {inp}/empty.txt -o {out}", 1, "no edges found"),
    case("comments-only", "convert {inp}/comments_only.txt -o {out}", 1, "no edges found"),
    case("header-in-edge-list", "convert {inp}/header.txt -o {out}", 1, "(if this is a header, use --format csv)"),
    case("nodes-contradicted", "convert {inp}/nodes_contradicted.txt -o {out}", 1, "'# Nodes: 2' on line 1 declares 2 nodes"),
    case("conflicting-weights", "convert {inp}/conflicting_weights.txt -o {out}", 1, "edge 0 -> 1 appears with weights 1 and 2"),
    case("crlf-missing-field", "convert {inp}/crlf_missing.txt -o {out}", 1, "line 2: expected two node ids"),
    case("last-line-no-newline", "convert {inp}/last_line_bad.txt -o {out}", 1, "line 2: node ids must be integers: '7 x'"),
    case("double-comma", "convert {inp}/double_comma.txt -o {out}", 1, "line 1: node ids must be integers"),
    case("glued-letters", "convert {inp}/glued.txt -o {out}", 1, "line 1: node ids must be integers"),
    case("inline-comment", "convert {inp}/inline_comment.txt -o {out}", 1, "line 1: "),
    case("utf16", "convert {inp}/utf16.txt -o {out}", 1, "is UTF-16 text; save it as UTF-8"),
    case("binary-garbage", "convert {inp}/garbage.bin -o {out}", 1, "line 1: "),
    case("hdf5-as-input", "convert {inp}/good.h5 -o {out}", 1, "is an HDF5 file"),
    case("zip-as-edge-list", "convert {inp}/zip_as_text.txt -o {out} --format edgelist", 1, "is a zip/npz archive; use --format npz"),
    # -------------------------------------------------------- convert: csv, tsv
    case("csv-header-mismatch", "convert {inp}/csv_header_mismatch.csv -o {out}", 1, "line 1: the header has 2 fields but line 2 has 3"),
    case("csv-bad-row", "convert {inp}/csv_bad_row.csv -o {out}", 1, "line 3: node ids must be integers: '3,oops'"),
    case("csv-trailing-comma", "convert {inp}/csv_trailing_comma.csv -o {out}", 1, "line 1: no weight"),
    case("tsv-missing-field", "convert {inp}/tsv_missing.tsv -o {out}", 1, "line 2: expected two node ids"),
    case("txt-as-csv-bad-row", "convert {inp}/letters.txt --format csv -o {out}", 1, "line 2: node ids must be integers"),
    # --------------------------------------------------- convert: Matrix Market
    case("mtx-zero-based", "convert {inp}/mtx_zero_based.mtx -o {out}", 1, "line 4: node ids are 1-based here, got 0"),
    case("mtx-beyond-size", "convert {inp}/mtx_beyond.mtx -o {out}", 1, "line 3: node id beyond the declared size 3"),
    case("mtx-truncated", "convert {inp}/mtx_truncated.mtx -o {out}", 1, "promises 5 entries, found 2 (truncated file?)"),
    case("mtx-too-many", "convert {inp}/mtx_too_many.mtx -o {out}", 1, "2 entries, more than the 1 the size line (line 2) promises"),
    case("mtx-not-square", "convert {inp}/mtx_not_square.mtx -o {out}", 1, "matrix is 3 x 4"),
    case("mtx-array", "convert {inp}/mtx_array.mtx -o {out}", 1, "only 'matrix coordinate'"),
    case("mtx-complex", "convert {inp}/mtx_complex.mtx -o {out}", 1, "unsupported Matrix Market field 'complex'"),
    case("mtx-symmetry", "convert {inp}/mtx_symmetry.mtx -o {out}", 1, "unknown Matrix Market symmetry 'diagonal'"),
    case("mtx-no-size-line", "convert {inp}/mtx_no_size.mtx -o {out}", 1, "no Matrix Market size line"),
    case("mtx-bad-size-line", "convert {inp}/mtx_bad_size.mtx -o {out}", 1, "line 2: expected 'rows cols entries'"),
    case("mtx-real-no-value", "convert {inp}/mtx_real_no_value.mtx -o {out}", 1, "line 4: no value (a 'real' Matrix Market"),
    case("mtx-pattern-value", "convert {inp}/mtx_pattern_value.mtx -o {out}", 1, "line 3: unexpected third field (a 'pattern'"),
    case("mtx-no-banner", "convert {inp}/mtx_no_banner.mtx -o {out}", 1, "line 1: not a Matrix Market banner"),
    case("mtx-banner-in-txt", "convert {inp}/mtx_in_txt.txt -o {out}", 1, "line 4: node ids are 1-based here"),
    case("mtx-huge-size", "convert {inp}/mtx_huge.mtx -o {out}", 1, "needs at least"),
    case("mtx-on-stdin-bad", "convert - -o {out}", 1, "<stdin>: line 3: node ids are 1-based here",
         stdin=(MTX + "3 3 1\n0 1\n").encode()),
    # --------------------------------------------------------- convert: npz, gzip
    case("npz-of-text", "convert {inp}/text.npz -o {out}", 1, "not an .npz file (a zip archive)"),
    case("npz-without-matrix", "convert {inp}/dense.npz -o {out}", 1, "it holds arrays x, not a sparse matrix"),
    case("npz-not-square", "convert {inp}/wide.npz -o {out}", 1, "matrix is 4 x 6"),
    case("npz-truncated", "convert {inp}/truncated.npz -o {out}", 1, "not a readable .npz archive"),
    case("npz-complex", "convert {inp}/complex.npz -o {out}", 1, "complex values"),
    case("format-npz-on-text", "convert {inp}/good.txt --format npz -o {out}", 1, "not an .npz file (a zip archive)"),
    case("corrupt-gzip", "convert {inp}/corrupt.txt.gz -o {out}", 1, "corrupt or truncated gzip data"),
    case("gzip-bad-line", "convert {inp}/bad_inside.txt.gz -o {out}", 1, "line 2: node ids must be integers"),
    case("stdin-corrupt-gzip", "convert - -o {out}", 1, "<stdin>: corrupt or truncated gzip data",
         stdin=gzip.compress(GOOD_EDGES.encode() * 50)[:40]),
    case("stdin-empty", "convert - -o {out}", 1, "<stdin>: no edges found", stdin=b""),
    # ------------------------------------------------- convert: paths, options
    case("missing-input", "convert {inp}/absent.txt -o {out}", 1, "absent.txt: no such file"),
    case("folder-input", "convert {inp}/adir -o {out}", 1, "is a folder, not an edge list"),
    case("stdin-needs-output", "convert -", 1, "needs an output file: add -o", stdin=b"0 1\n"),
    case("output-is-input", "convert {inp}/good.txt -o {inp}/good.txt", 1, "would overwrite the input"),
    case("output-is-folder", "convert {inp}/good.txt -o {inp}/adir", 2, "is a directory"),
    case("output-folder-missing", "convert {inp}/good.txt -o {inp}/nowhere/g.h5", 1, "does not exist"),
    case("output-foreign-h5", "convert {inp}/good.txt -o {inp}/foreign.h5", 1, "exists and is not a gnnio graph; add --force"),
    case("output-foreign-text", "convert {inp}/good.txt -o {inp}/notes.txt", 1, "exists and is not a gnnio graph; add --force"),
    case("default-output-foreign", "convert {inp}/data.txt", 1, "data.h5: exists and is not a gnnio graph; add --force"),
    case("num-nodes-zero", "convert {inp}/good.txt --num-nodes 0 -o {out}", 2, "--num-nodes"),
    case("num-nodes-small", "convert {inp}/good.txt --num-nodes 2 -o {out}", 1, "but --num-nodes is 2"),
    case("num-nodes-huge", "convert {inp}/good.txt --num-nodes 1000000000000 -o {out}", 1, "--num-nodes 1000000000000: a graph of"),
    case("num-nodes-not-int", "convert {inp}/good.txt --num-nodes many -o {out}", 2, "'many' is not a valid integer"),
    case("unknown-format", "convert {inp}/good.txt --format xml -o {out}", 2, "--format"),
    case("bad-self-loops", "convert {inp}/good.txt --self-loops maybe -o {out}", 2, "--self-loops"),
    case("convert-unknown-option", "convert {inp}/good.txt --bogus -o {out}", 2, "No such option '--bogus'"),
    case("convert-no-input", "convert", 2, "Missing argument 'INPUT'"),
    # ------------------------------------------------------------------ reorder
    case("reorder-missing", "reorder {inp}/absent.h5 --method rcm -o {out}", 1, "absent.h5: no such file"),
    case("reorder-folder", "reorder {inp}/adir --method rcm -o {out}", 1, "is a folder, not a gnnio graph"),
    case("reorder-text", "reorder {inp}/good.txt --method rcm -o {out}", 1, "not a readable HDF5 file"),
    case("reorder-foreign", "reorder {inp}/foreign.h5 --method rcm -o {out}", 1, "not a gnnio graph"),
    case("reorder-version-string", "reorder {inp}/version_string.h5 --method rcm -o {out}", 1, "format_version is 'abc'"),
    case("reorder-version-newer", "reorder {inp}/version_newer.h5 --method rcm -o {out}", 1, "format version 99 is newer"),
    case("reorder-nodes-string", "reorder {inp}/nodes_string.h5 --method rcm -o {out}", 1, "num_nodes is 'many'"),
    case("reorder-params-not-json", "reorder {inp}/params_not_json.h5 --method rcm -o {out}", 1, "params is not a JSON object"),
    case("reorder-no-indices", "reorder {inp}/no_indices.h5 --method rcm -o {out}", 1, "damaged gnnio graph"),
    case("reorder-inconsistent", "reorder {inp}/inconsistent.h5 --method rcm -o {out}", 1, "/csc arrays inconsistent"),
    case("reorder-float-indptr", "reorder {inp}/float_indptr.h5 --method rcm -o {out}", 1, "not a one-dimensional integer array"),
    case("reorder-truncated", "reorder {inp}/truncated.h5 --method rcm -o {out}", 1, "truncated or corrupt"),
    case("reorder-bad-method", "reorder {inp}/good.h5 --method metis -o {out}", 2, "--method"),
    case("reorder-no-method", "reorder {inp}/good.h5 -o {out}", 2, "Missing option '--method'"),
    case("reorder-output-folder-missing", "reorder {inp}/good.h5 --method rcm -o {inp}/nowhere/r.h5", 1, "does not exist"),
    case("reorder-output-is-folder", "reorder {inp}/good.h5 --method rcm -o {inp}/adir", 1, "is a folder; name a file"),
    case("reorder-output-foreign", "reorder {inp}/good.h5 --method rcm -o {inp}/foreign.h5", 1, "exists and is not a gnnio graph"),
    case("reorder-blocked-zero", "reorder {inp}/good.h5 --method rcm --blocked 0 -o {out}", 2, "--blocked"),
    case("reorder-l2-zero", "reorder {inp}/good.h5 --method rcm --l2-mb 0 -o {out}", 2, "--l2-mb"),
    case("reorder-features-zero", "reorder {inp}/good.h5 --method rcm --features 0 -o {out}", 2, "--features"),
    # ---------------------------------------------------------------- partition
    case("partition-missing", "partition {inp}/absent.h5 --parts 2", 1, "absent.h5: no such file"),
    case("partition-folder", "partition {inp}/adir --parts 2", 1, "is a folder, not a gnnio graph"),
    case("partition-text", "partition {inp}/good.txt --parts 2", 1, "not a readable HDF5 file"),
    case("partition-foreign", "partition {inp}/foreign.h5 --parts 2", 1, "not a gnnio graph"),
    case("partition-truncated", "partition {inp}/truncated.h5 --parts 2", 1, "truncated or corrupt"),
    case("partition-version-newer", "partition {inp}/version_newer.h5 --parts 2", 1, "format version 99 is newer"),
    case("partition-no-indices", "partition {inp}/no_indices.h5 --parts 2", 1, "damaged gnnio graph"),
    case("partition-zero-parts", "partition {inp}/good.h5 --parts 0", 1, "--parts must be at least 1, got 0"),
    case("partition-bad-order", "partition {inp}/good.h5 --parts 2 --order metis", 1, "--order: unknown order 'metis'"),
    case("partition-no-parts", "partition {inp}/good.h5", 2, "Missing option '--parts'"),
    case("run-gpus-without-graph", "run --layer gat --gpus 2 --device cpu", 2, "--gpus needs --graph G.h5"),
    case("run-gpus-graph-missing", "run --layer gat --graph {inp}/absent.h5 --gpus 2 --device cpu", 1, "absent.h5: no such file"),
    case("run-gpus-bad-order", "run --layer gat --graph {inp}/good.h5 --gpus 2 --device cpu --order metis", 1,
         "--order: unknown order 'metis'"),
    case("run-gpus-profile", "run --layer gat --graph {inp}/good.h5 --gpus 2 --device cpu --profile", 2,
         "--profile does not apply"),
    case("run-gpus-zero", "run --layer gat --graph {inp}/good.h5 --gpus 0 --device cpu", 2, "--gpus"),
    case("run-gpus-bad-heads", "run --layer gat --graph {inp}/good.h5 --gpus 2 --device cpu --heads 3", 1,
         "--heads 3 does not divide --features 128"),
    pytest.param(Case("run --layer gat --graph {inp}/good.h5 --gpus 2 --device cuda", 1, "--device cuda"),
                 id="run-gpus-cuda-without-gpu", marks=NO_GPU),
    case("run-gpu-memory-on-cpu", "run --layer gat --graph {inp}/good.h5 --gpus 2 --device cpu --gpu-memory 80", 1,
         "--gpu-memory 80: caps a GPU's memory; the device is cpu"),
    case("run-gpu-memory-without-gpus", "run --layer gat --gpu-memory 80", 2, "--gpu-memory caps the GPUs of distributed"),
    case("run-gpu-memory-zero", "run --layer gat --graph {inp}/good.h5 --gpus 2 --device cpu --gpu-memory 0", 2,
         "--gpu-memory"),
    # ----------------------------------------------------------- profile-degree
    case("profile-missing", "profile-degree {inp}/absent.h5", 1, "absent.h5: no such file"),
    case("profile-version-string", "profile-degree {inp}/version_string.h5", 1, "format_version is 'abc'"),
    case("profile-no-indices", "profile-degree {inp}/no_indices.h5", 1, "damaged gnnio graph"),
    case("profile-foreign", "profile-degree {inp}/foreign.h5", 1, "not a gnnio graph"),
    case("profile-edge-list", "profile-degree {inp}/good.txt", 1, "not a readable HDF5 file"),
    case("profile-plot-without-matplotlib", "profile-degree {inp}/good.h5 --plot {out}.png", 1, "pip install matplotlib",
         without_matplotlib=True),
    case("profile-features-zero", "profile-degree {inp}/good.h5 --features 0", 2, "--features"),
    case("profile-bad-dtype", "profile-degree {inp}/good.h5 --dtype fp8", 2, "--dtype"),
    case("profile-negative-l2", "profile-degree {inp}/good.h5 --l2-mb -1", 2, "--l2-mb"),
    case("profile-unknown-option", "profile-degree {inp}/good.h5 --bogus", 2, "No such option"),
    # ----------------------------------------------------------------- generate
    case("rmat-scale-zero", "generate rmat --scale 0 -o {out}", 1, "--scale: must be in 1..31, got 0"),
    case("rmat-scale-99", "generate rmat --scale 99 -o {out}", 1, "--scale: must be in 1..31, got 99"),
    case("rmat-scale-31-memory", "generate rmat --scale 31 -o {out}", 1, "rmat31: a graph of 2,147,483,648 nodes"),
    case("rmat-probabilities", "generate rmat --scale 5 -a 0.9 -b 0.2 -o {out}", 1, "a + b + c <= 1"),
    case("rmat-negative-probability", "generate rmat --scale 5 -a -0.1 -o {out}", 1, "need a, b, c >= 0"),
    case("rmat-no-scale", "generate rmat -o {out}", 2, "Missing option '--scale'"),
    case("rmat-scale-word", "generate rmat --scale big -o {out}", 2, "'big' is not a valid integer"),
    case("rmat-edge-factor-zero", "generate rmat --scale 5 --edge-factor 0 -o {out}", 2, "--edge-factor"),
    case("rmat-negative-seed", "generate rmat --scale 5 --seed -1 -o {out}", 2, "--seed"),
    case("uniform-degree-zero", "generate uniform --scale 5 --degree 0 -o {out}", 1, "--degree: must be in 1..31"),
    case("uniform-degree-too-big", "generate uniform --scale 5 --degree 64 -o {out}", 1, "--degree: must be in 1..31"),
    case("grid-rows-zero", "generate grid --rows 0 --cols 4 -o {out}", 1, "must be at least 1"),
    case("grid-negative", "generate grid --rows -3 --cols 4 -o {out}", 1, "must be at least 1"),
    case("grid-memory", "generate grid --rows 100000 --cols 100000 -o {out}", 1, "grid100000: a graph of"),
    case("generate-output-folder-missing", "generate grid --rows 3 --cols 3 -o {inp}/nowhere/g.h5", 1, "does not exist"),
    case("generate-edges-folder-missing", "generate grid --rows 3 --cols 3 -o {out} --write-edges {inp}/nowhere/e.txt", 1,
         "--write-edges"),
    case("generate-output-is-folder", "generate grid --rows 3 --cols 3 -o {inp}/adir", 2, "is a directory"),
    case("generate-edges-is-folder", "generate grid --rows 3 --cols 3 -o {out} --write-edges {inp}/adir", 2, "is a directory"),
    case("generate-output-foreign", "generate grid --rows 3 --cols 3 -o {inp}/foreign.h5", 1, "exists and is not a gnnio graph"),
    case("generate-edges-foreign", "generate grid --rows 3 --cols 3 -o {out} --write-edges {inp}/notes.txt", 1,
         "exists and is not an edge list written by gnnio"),
    case("generate-edges-not-by-gnnio", "generate grid --rows 3 --cols 3 -o {out} --write-edges {inp}/good.edges.txt", 1,
         "exists and is not an edge list written by gnnio"),
    case("generate-edges-same-as-output", "generate grid --rows 3 --cols 3 -o {out} --write-edges {out}", 1,
         "the same file as the graph's output"),
    case("generate-unknown-kind", "generate torus --rows 3", 2, "No such command 'torus'"),
    # ---------------------------------------------------------------- run
    case("run-bad-layer", "run --layer nope", 2, "--layer"),
    case("run-no-layer", "run", 2, "Missing option '--layer'"),
    case("run-heads-negative", "run --layer gat --heads -2 --device cpu", 1, "--heads must be at least 1, got -2"),
    case("run-heads-not-dividing", "run --layer gat --heads 3 --device cpu", 1, "--heads 3 does not divide --features 128"),
    case("run-features-zero", "run --layer gcn --features 0 --device cpu", 1, "--features must be positive"),
    case("run-graph-missing", "run --layer gcn --graph {inp}/absent.h5 --device cpu", 1, "absent.h5: no such file"),
    case("run-graph-damaged", "run --layer gcn --graph {inp}/version_string.h5 --device cpu", 1, "format_version is 'abc'"),
    case("run-graph-edge-list", "run --layer gcn --graph {inp}/good.txt --device cpu", 1, "not a readable HDF5 file"),
    case("run-graph-rmat99", "run --layer gcn --graph rmat99 --device cpu", 1, "--graph rmat99: rmat<scale> needs a scale in 1..31"),
    case("run-graph-unknown", "run --layer gcn --graph cora2 --device cpu", 1, "unknown standard graph 'cora2'"),
    case("run-graph-bad-modifier", "run --layer gcn --graph grid8+bogus --device cpu", 1, "unknown modifier '+bogus'"),
    case("run-repeat-zero", "run --layer gcn --repeat 0", 2, "--repeat"),
    case("run-bad-dtype", "run --layer gcn --dtype fp8", 2, "--dtype"),
    pytest.param(Case("run --layer gcn --device cuda", 1, "--device cuda"), id="run-cuda-without-gpu", marks=NO_GPU),
    # ------------------------------------------------------------- compare
    case("compare-bad-layer", "compare --layer gcn,bogus --device cpu", 1, "--layer bogus: unknown layer"),
    case("compare-bad-against", "compare --layer gcn --against bogus --device cpu", 2, "'bogus' is not one of reference"),
    case("compare-bad-reorder", "compare --layer gcn --reorder rcm,metis --device cpu", 2, "'metis' is not one of none"),
    case("compare-graph-missing", "compare --layer gcn --graph {inp}/absent.h5 --device cpu", 1, "no such file"),
    case("compare-heads-zero", "compare --layer gat --heads 0 --device cpu", 1, "--heads must be at least 1, got 0"),
    case("compare-no-layer", "compare", 2, "Missing option '--layer'"),
    # --------------------------------------------------------------- train
    case("train-bad-model", "train --model mlp", 2, "--model"),
    case("train-no-model", "train", 2, "Missing option '--model'"),
    case("train-empty-data-dir", "train --model gcn --data-dir {inp}/empty_dir", 1, "Planetoid files ind.cora.* not found"),
    case("train-seeds-zero", "train --model gcn --seeds 0", 2, "--seeds"),
    case("train-epochs-zero", "train --model gcn --epochs 0", 2, "--epochs"),
    pytest.param(Case("train --model gcn --device cuda --epochs 1 --seeds 1", 1, "--device cuda"), id="train-cuda-without-gpu",
                 marks=NO_GPU),
    # ------------------------------------------------------- doctor, the group
    case("doctor-unknown-option", "doctor --bogus", 2, "No such option '--bogus'"),
    case("unknown-command", "bogus", 2, "No such command 'bogus'"),
    case("unknown-group-option", "--bogus", 2, "No such option '--bogus'"),
]


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every file under `folder` (hidden ones too): size, modification time and content digest."""
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            stat = path.stat()
            files[str(path.relative_to(folder))] = (stat.st_size, stat.st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
    return files


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("inputs")
    _build_inputs(folder)
    return folder


@pytest.mark.parametrize("existing_output", [False, True], ids=["fresh-output", "existing-graph"])
@pytest.mark.parametrize("bad", CASES)
def test_one_line_no_traceback_nothing_changed(bad: Case, existing_output, inputs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a default output would land here, and be seen
    out = tmp_path / "out.h5"
    if existing_output:
        shutil.copy(inputs / "good.h5", out)
    if bad.without_matplotlib:
        monkeypatch.setitem(sys.modules, "matplotlib", None)
    args = bad.args.format(inp=inputs, out=out).split()
    before = snapshot(inputs), snapshot(tmp_path)
    status, stdout, stderr = run_gnnio(args, capsys, monkeypatch, bad.stdin)
    lines = stderr.splitlines()
    assert status == bad.status, stderr
    assert len(lines) == 1, stderr
    assert lines[0].startswith("gnnio: error: ") and "Traceback" not in stderr, stderr
    assert bad.fragment in lines[0], stderr
    assert stdout == ""
    assert (snapshot(inputs), snapshot(tmp_path)) == before


def test_cases_cover_every_subcommand():
    from gnnio_cli.cli import SUBCOMMANDS

    commands = {param.values[0].args.split()[0] for param in CASES}
    assert set(SUBCOMMANDS) <= commands and len(CASES) >= 100


@pytest.mark.parametrize(
    "args",
    [
        "convert {inp}/word_weight.txt -o {out}",
        "reorder {inp}/version_string.h5 --method rcm -o {out}",
        "generate grid --rows 3 --cols 3 -o {out} --write-edges {inp}/nowhere/e.txt",
    ],
)
def test_real_entry_point_prints_the_same_line(args, inputs, tmp_path, capsys, monkeypatch):
    argv = args.format(inp=inputs, out=tmp_path / "out.h5").split()
    status, _, in_process = run_gnnio(argv, capsys, monkeypatch)
    completed = subprocess.run([sys.executable, "-m", "gnnio_cli", *argv], capture_output=True, text=True, cwd=REPO,
                               timeout=300)
    assert completed.returncode == status == 1
    assert completed.stderr == in_process and completed.stdout == ""
    assert os.listdir(tmp_path) == []
