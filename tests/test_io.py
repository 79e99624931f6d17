"""Edge list readers (gnnio_cli.graph.io): every format, compressed and stdin
input, and one-line errors that name the file, the line and its text."""

from __future__ import annotations

import gzip
import io as stdlib_io
import sys

import numpy as np
import pytest
import scipy.sparse

from gnnio_cli.errors import GnnioError, InputFormatError
from gnnio_cli.graph import io


def write(path, text: str) -> str:
    path.write_bytes(text.encode())
    return str(path)


def random_pairs(seed: int, count: int, largest: int = 10**6):
    rng = np.random.default_rng(seed)
    return rng.integers(0, largest, count), rng.integers(0, largest, count)


# ------------------------------------------------------------------ formats


def test_snap_text_mixed_separators_comments_crlf(tmp_path):
    text = "# Directed graph\n# Nodes: 12 Edges: 5\n0\t1\r\n  2 3\n\n4,5\n% note\n9 ; 8\n7\t6"
    edges = io.read_edges(write(tmp_path / "g.txt", text))
    assert edges.src.tolist() == [0, 2, 4, 9, 7]
    assert edges.dst.tolist() == [1, 3, 5, 8, 6]
    assert edges.src.dtype == np.int64 and edges.dst.dtype == np.int64
    assert edges.declared_num_nodes == 12 and edges.weights is None
    assert edges.format == "edgelist"
    weighted = io.read_edges(write(tmp_path / "w.txt", text.replace("1\r", "1\t2\r").replace("3\n", "3 0.5\n")
                                   .replace("4,5", "4,5,-1e-3").replace("; 8", "; 8 ; 7").replace("6", "6\t1700000000")))
    assert weighted.src.tolist() == [0, 2, 4, 9, 7]
    assert weighted.weights.tolist() == [2.0, 0.5, -1e-3, 7.0, 1700000000.0]


def test_parallel_chunks_match_a_plain_reference(tmp_path, monkeypatch):
    """Many small chunks (cut at newlines) give the same edges and line numbers as one pass."""
    monkeypatch.setattr(io.text, "_MIN_CHUNK_BYTES", 64)
    src, dst = random_pairs(seed=1, count=5000)
    rng = np.random.default_rng(2)
    lines = []
    for s, d in zip(src, dst):
        roll = rng.random()
        if roll < 0.05:
            lines.append("# comment")
        elif roll < 0.08:
            lines.append("")
        lines.append(f"{s}\t{d}\r" if roll > 0.9 else f"{s} {d}")
    path = write(tmp_path / "g.txt", "\n".join(lines) + "\n")
    edges = io.read_edges(path)
    np.testing.assert_array_equal(edges.src, src)
    np.testing.assert_array_equal(edges.dst, dst)

    bad_line = 3777
    lines[bad_line - 1] = "12 x"
    path = write(tmp_path / "bad.txt", "\n".join(lines) + "\n")
    with pytest.raises(InputFormatError, match=rf"line {bad_line}: node ids must be integers: '12 x'"):
        io.read_edges(path)


@pytest.mark.parametrize("weighted", [False, True])
def test_ids_of_every_width_and_line_shape(tmp_path, weighted):
    """The 8-bytes-at-a-time path (ids up to 7 digits, one separator) and the
    byte loop (longer ids, 19 digits, runs of blanks, trailing blanks, CRLF) agree."""
    rng = np.random.default_rng(7)
    widths = rng.integers(1, 20, size=(3000, 2))
    ids = np.minimum(rng.random((3000, 2)) * 10.0**widths, 2**63 - 1024).astype(np.int64)
    ids[0] = [2**63 - 1, 10**18]
    separators = ["\t", " ", ",", ";", "  ", " , ", "\t\t"]
    endings = ["\n", "\r\n", " \n", "\t\r\n"]
    weights = (rng.standard_normal(3000) * 10.0 ** rng.integers(-5, 6, 3000)).tolist()
    text = "".join(
        f"{s}{separators[i % len(separators)]}{d}"
        + (f"{separators[(i + 3) % len(separators)]}{weights[i]!r}" if weighted else "")
        + endings[i % len(endings)]
        for i, (s, d) in enumerate(ids.tolist())
    )
    edges = io.read_edges(write(tmp_path / "g.txt", text))
    np.testing.assert_array_equal(edges.src, ids[:, 0])
    np.testing.assert_array_equal(edges.dst, ids[:, 1])
    if weighted:
        np.testing.assert_allclose(edges.weights, weights, rtol=1e-15)
    else:
        assert edges.weights is None


@pytest.mark.parametrize("separator,suffix", [(",", ".csv"), ("\t", ".tsv")])
def test_csv_tsv_with_and_without_header(tmp_path, separator, suffix):
    rows = [(5, 6), (7, 8), (0, 9)]
    body = "".join(f"{s}{separator}{d}{separator}1.5\n" for s, d in rows)
    for header in ("", f"source{separator}target{separator}weight\n"):
        edges = io.read_edges(write(tmp_path / f"g{suffix}", header + body))
        assert list(zip(edges.src.tolist(), edges.dst.tolist())) == rows
        assert edges.format == suffix[1:]


def test_header_line_number_counts_in_csv_errors(tmp_path):
    path = write(tmp_path / "g.csv", "# exported\nsrc,dst\n1,2\n3,oops\n")
    with pytest.raises(InputFormatError, match=r"g\.csv: line 4: node ids must be integers: '3,oops'"):
        io.read_edges(path)


def test_header_in_plain_edge_list_suggests_csv(tmp_path):
    path = write(tmp_path / "g.txt", "from to\n1 2\n")
    with pytest.raises(InputFormatError, match=r"line 1: .*'from to' \(if this is a header, use --format csv\)"):
        io.read_edges(path)
    edges = io.read_edges(path, format="csv")
    assert edges.src.tolist() == [1] and edges.dst.tolist() == [2]


MTX_GENERAL = """%%MatrixMarket matrix coordinate real general
% a comment
3 3 4
1 2 0.5
2 3 1e3
3 1 -2
2 2 7
"""

MTX_SYMMETRIC = """%%MatrixMarket matrix coordinate pattern symmetric
4 4 3
2 1
4 3
3 3
"""


def test_matrix_market_general(tmp_path):
    edges = io.read_edges(write(tmp_path / "g.mtx", MTX_GENERAL))
    assert edges.src.tolist() == [0, 1, 2, 1] and edges.dst.tolist() == [1, 2, 0, 1]
    assert edges.declared_num_nodes == 3 and not edges.symmetric


def test_matrix_market_symmetric_is_mirrored(tmp_path):
    edges = io.read_edges(write(tmp_path / "g.mtx", MTX_SYMMETRIC))
    assert edges.symmetric and edges.declared_num_nodes == 4
    src, dst = io.mirror(edges.src, edges.dst)
    assert sorted(zip(src.tolist(), dst.tolist())) == [(0, 1), (1, 0), (2, 2), (2, 3), (3, 2)]


def test_matrix_market_integer_field(tmp_path):
    text = "%%MatrixMarket matrix coordinate integer general\n2 2 1\n2 1 42\n"
    edges = io.read_edges(write(tmp_path / "g.mtx", text))
    assert edges.src.tolist() == [1] and edges.dst.tolist() == [0]


@pytest.mark.parametrize(
    "text,message",
    [
        ("%%MatrixMarket matrix coordinate pattern general\n3 3 2\n1 2\n0 1\n", r"line 4: node ids are 1-based here, got 0: '0 1'"),
        ("%%MatrixMarket matrix coordinate pattern general\n3 3 1\n1 4\n", r"line 3: node id beyond the declared size 3: '1 4'"),
        ("%%MatrixMarket matrix coordinate pattern general\n3 3 5\n1 2\n2 3\n", r"promises 5 entries, found 2 \(truncated"),
        ("%%MatrixMarket matrix coordinate pattern general\n3 4 1\n1 2\n", r"3 x 4; a graph's adjacency matrix is square"),
        ("%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n4\n", r"only 'matrix coordinate'"),
        ("%%MatrixMarket matrix coordinate complex general\n2 2 1\n1 2 1 1\n", r"unsupported Matrix Market field 'complex'"),
        ("1 2\n", r"line 1: not a Matrix Market banner"),
        ("%%MatrixMarket matrix coordinate pattern general\n% only comments\n", r"no Matrix Market size line"),
    ],
)
def test_matrix_market_errors(tmp_path, text, message):
    with pytest.raises(GnnioError, match=message) as caught:
        io.read_edges(write(tmp_path / "g.mtx", text))
    assert "\n" not in str(caught.value) and "g.mtx" in str(caught.value)


def test_npz_row_is_source(tmp_path):
    rng = np.random.default_rng(3)
    rows, cols = rng.integers(0, 50, 200), rng.integers(0, 50, 200)
    matrix = scipy.sparse.coo_matrix((np.ones(200), (rows, cols)), shape=(50, 50)).tocsr()
    path = tmp_path / "g.npz"
    scipy.sparse.save_npz(path, matrix)
    edges = io.read_edges(str(path))
    coo = matrix.tocoo()
    assert sorted(zip(edges.src.tolist(), edges.dst.tolist())) == sorted(zip(coo.row.tolist(), coo.col.tolist()))
    assert edges.declared_num_nodes == 50 and edges.format == "npz"


def test_npz_errors(tmp_path):
    path = tmp_path / "wide.npz"
    scipy.sparse.save_npz(path, scipy.sparse.random(4, 6, density=0.5, format="csr", random_state=4))
    with pytest.raises(GnnioError, match=r"4 x 6; a graph's adjacency matrix is square"):
        io.read_edges(str(path))
    dense = tmp_path / "dense.npz"
    np.savez(dense, x=np.arange(3))
    with pytest.raises(GnnioError, match=r"dense\.npz: not a scipy sparse \.npz"):
        io.read_edges(str(dense))


def test_gzip_recognised_by_content_and_name(tmp_path):
    src, dst = random_pairs(seed=5, count=300)
    text = "".join(f"{s}\t{d}\n" for s, d in zip(src, dst)).encode()
    for name in ("g.txt.gz", "g.edges"):
        path = tmp_path / name
        path.write_bytes(gzip.compress(text))
        edges = io.read_edges(str(path))
        np.testing.assert_array_equal(edges.src, src)
        np.testing.assert_array_equal(edges.dst, dst)
    mtx = tmp_path / "g.mtx.gz"
    mtx.write_bytes(gzip.compress(MTX_GENERAL.encode()))
    assert io.read_edges(str(mtx)).format == "mtx"


def test_corrupt_gzip(tmp_path):
    path = tmp_path / "g.txt.gz"
    path.write_bytes(gzip.compress(b"1 2\n" * 1000)[:40])
    with pytest.raises(GnnioError, match=r"g\.txt\.gz: corrupt or truncated gzip data"):
        io.read_edges(str(path))


@pytest.mark.parametrize("compress", [False, True])
def test_stdin(monkeypatch, compress):
    payload = b"# Nodes: 9\n3 4\n5 6\n"
    payload = gzip.compress(payload) if compress else payload
    monkeypatch.setattr(sys, "stdin", stdlib_io.TextIOWrapper(stdlib_io.BytesIO(payload)))
    edges = io.read_edges("-")
    assert edges.src.tolist() == [3, 5] and edges.dst.tolist() == [4, 6]
    assert edges.declared_num_nodes == 9 and edges.name == "<stdin>"


# -------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "text,line,message,shown",
    [
        ("0 1\n2\n", 2, "expected two node ids", "2"),
        ("0 1\n2 \n", 2, "expected two node ids", "2 "),
        ("0 1\na b\n", 2, "node ids must be integers", "a b"),
        ("0 1\n1.5 2\n", 2, "node ids must be integers", "1.5 2"),
        ("0 1\n1 2x\n", 2, "node ids must be integers", "1 2x"),
        ("0 1\n1,,2\n", 2, "node ids must be integers", "1,,2"),
        ("# c\n0 -1\n", 2, "node ids must be non-negative", "0 -1"),
        ("-4 1\n", 1, "node ids must be non-negative", "-4 1"),
        ("1 9223372036854775808\n", 1, "node id larger than 2^63 - 1", "1 9223372036854775808"),
        ("1 123456789012345678901\n", 1, "node id larger than 2^63 - 1", "1 123456789012345678901"),
        ("0 1\r\n3\r\n", 2, "expected two node ids", "3"),
        ("0 1\n7 x", 2, "node ids must be integers", "7 x"),  # last line without a newline
    ],
)
def test_malformed_line_names_file_line_and_text(tmp_path, text, line, message, shown):
    path = write(tmp_path / "bad.txt", text)
    with pytest.raises(InputFormatError) as caught:
        io.read_edges(path)
    error = str(caught.value)
    assert error.startswith(f"{path}: line {line}: {message}")
    assert error.endswith(repr(shown)) and "\n" not in error


@pytest.mark.parametrize("text", ["", "# only a comment\n% and another\n\n"])
def test_no_edges(tmp_path, text):
    with pytest.raises(GnnioError, match=r"g\.txt: no edges found \(empty file\?\)"):
        io.read_edges(write(tmp_path / "g.txt", text))


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(GnnioError, match=r"nope\.txt: no such file$"):
        io.read_edges(str(tmp_path / "nope.txt"))
    with pytest.raises(GnnioError, match=r"is a folder"):
        io.read_edges(str(tmp_path))


def test_hdf5_input_is_refused(tmp_path):
    path = tmp_path / "g.txt"
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    with pytest.raises(GnnioError, match=r"is an HDF5 file"):
        io.read_edges(str(path))


def test_unknown_format_option(tmp_path):
    with pytest.raises(GnnioError, match=r"--format: unknown format 'xml'"):
        io.read_edges(write(tmp_path / "g.txt", "1 2\n"), format="xml")


def test_detect_format():
    assert io.detect_format("a/b.MTX.gz", b"\x1f\x8b") == "mtx"
    assert io.detect_format("g.csv", b"1,2") == "csv"
    assert io.detect_format("g.tsv", b"1\t2") == "tsv"
    assert io.detect_format("g.npz", b"PK\x03\x04") == "npz"
    assert io.detect_format("g.bin", b"PK\x03\x04") == "npz"
    assert io.detect_format("g.txt", b"1 2\n") == "edgelist"
    assert io.detect_format("-", b"# c\n") == "edgelist"


# ------------------------------------------------------------------ writing


@pytest.mark.parametrize("name", ["edges.txt", "edges.txt.gz"])
def test_write_edge_list_round_trip(tmp_path, name):
    src, dst = random_pairs(seed=6, count=2000, largest=10**12)
    src[0], dst[0] = 0, 9  # single digits too
    path = tmp_path / name
    io.write_edge_list(path, src, dst, num_nodes=10**12, title="round trip")
    edges = io.read_edges(str(path))
    np.testing.assert_array_equal(edges.src, src)
    np.testing.assert_array_equal(edges.dst, dst)
    assert edges.declared_num_nodes == 10**12
