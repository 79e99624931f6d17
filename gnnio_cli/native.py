"""Finds, builds and loads gnnio's native extension; says clearly why not.

The C++/CUDA sources in ``native/`` are compiled on first use with
``torch.utils.cpp_extension.load`` (ninja) into a cache folder keyed by a hash
of everything that changes the binary: the sources, torch's and CUDA's
versions, the Python ABI, the GPU arch list and the flags. The folder is
``$GNNIO_CACHE_DIR/<hash>`` (default ``~/.cache/gnnio/native/<hash>``), so a
rebuilt torch or an edited kernel never loads a stale binary, and a second
process reuses the first one's build.

- :func:`load` builds (if needed) and loads the ops into ``torch.ops.gnnio``,
  or raises :class:`NativeUnavailable` with one line saying what is missing and
  what to do.
- :func:`is_available` never raises; it remembers the reason (:func:`reason`),
  so the library falls back to the reference at the cost of one check.
- :func:`status` gathers the facts ``gnnio doctor`` prints.

Environment: ``GNNIO_CACHE_DIR`` (cache root), ``GNNIO_NATIVE=0`` (never use the
native kernels), ``TORCH_CUDA_ARCH_LIST`` (arch list, default: the visible
GPU's, ``9.0a`` on H100/H200), ``GNNIO_NATIVE_VERBOSE=1`` (show the
compiler's output and ptxas register/spill reports).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import torch

from gnnio_cli.errors import NativeUnavailable
from gnnio_cli.resources import NATIVE_DIR

SOURCE_DIR = NATIVE_DIR
EXTENSION_NAME = "gnnio_native"
# Bump when the way the build is configured changes in a way the hash below misses.
BUILD_RECIPE = 1

# graph_facts' output layout: per side (CSR, then CSC) SIDE_WIDTH counts, then the edge list's
# (gnnio_cli.graph.schedule reads it; its fake kernel below gives the shape).
SIDE_WIDTH = 6  # max degree, non-empty rows, heavy rows and tiles at t0, the same with every degree + 1 at t1
EDGE_FACTS = 5  # min source, max source, min target, max target, self-loops
FACTS_WIDTH = 2 * SIDE_WIDTH + EDGE_FACTS

CXX_FLAGS = ["-O3"]
CUDA_FLAGS = ["-O3", "-lineinfo"]

_lock = threading.Lock()
_loaded_from: Optional[Path] = None
_failure: Optional[str] = None
_build_seconds: Optional[float] = None


# ------------------------------------------------------------------ facts
@dataclass
class NativeStatus:
    """What `gnnio doctor` reports: versions, GPU, build and why a backend is (not) usable."""

    python: str
    torch: str
    torch_cuda: Optional[str]
    gpu: Optional[str]
    gpu_capability: Optional[str]
    cuda_home: Optional[str]
    nvcc: Optional[str]
    ninja: Optional[str]
    arch_list: Optional[str]
    cache_dir: Optional[str]
    built: bool
    build_seconds: Optional[float]
    loaded: bool
    ops: list[str] = field(default_factory=list)
    reason: Optional[str] = None
    backends: dict[str, str] = field(default_factory=dict)


def cache_root() -> Path:
    root = os.environ.get("GNNIO_CACHE_DIR")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "gnnio" / "native"


def source_files() -> list[Path]:
    """Every C++ and CUDA source of the extension, subfolders (native/attention/) included: the .cpp files,
    then the .cu files (each family registers itself). Basenames are unique: the build names objects by them."""
    return sorted(SOURCE_DIR.rglob("*.cpp")) + sorted(SOURCE_DIR.rglob("*.cu"))


def _header_files() -> list[Path]:
    return sorted(SOURCE_DIR.rglob("*.cuh")) + sorted(SOURCE_DIR.rglob("*.h"))


def cuda_home() -> Optional[str]:
    from torch.utils import cpp_extension

    return cpp_extension.CUDA_HOME


def _nvcc_path() -> Optional[str]:
    home = cuda_home()
    if home and (Path(home) / "bin" / "nvcc").exists():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def nvcc_version() -> Optional[str]:
    nvcc = _nvcc_path()
    if nvcc is None:
        return None
    try:
        text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"release ([\d.]+), V([\d.]+)", text)
    return found.group(2) if found else text.strip().splitlines()[-1] if text.strip() else None


def _ninja_path() -> Optional[str]:
    beside_python = Path(sys.executable).parent / "ninja"
    return shutil.which("ninja") or (str(beside_python) if beside_python.exists() else None)


def ninja_version() -> Optional[str]:
    ninja = _ninja_path()
    if ninja is None:
        return None
    try:
        return subprocess.run([ninja, "--version"], capture_output=True, text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def arch_list() -> Optional[str]:
    """The GPU archs to compile for: $TORCH_CUDA_ARCH_LIST, else the visible GPU's capability.

    Compute capability 9.0 (H100, H200) builds for sm_90a ("9.0a"), whose code runs on those
    GPUs alone and may use their warpgroup MMAs (wgmma: native/dense.cu's projections)."""
    explicit = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if explicit:
        return explicit
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return "9.0a" if (major, minor) == (9, 0) else f"{major}.{minor}"
    return None


def _library_dirs(name: str, filename_glob: str) -> list[Path]:
    """Folders that hold `filename_glob`: CUDA_HOME first, then the NVIDIA wheels beside torch."""
    home = cuda_home()
    candidates: list[Path] = []
    if home:
        candidates += [Path(home) / name, Path(home) / "lib64", *Path(home).glob(f"targets/*/{name}")]
    for site in {Path(torch.__file__).resolve().parent.parent, Path(sysconfig.get_paths()["purelib"])}:
        candidates += sorted(site.glob(f"nvidia/*/{name}"))
    return [folder for folder in candidates if folder.is_dir() and any(folder.glob(filename_glob))]


def _cusparse_flags() -> tuple[list[str], list[str]]:
    """Include folders and linker flags for cuSPARSE, which a toolkit without its math libraries lacks."""
    include_dirs = _library_dirs("include", "cusparse.h")
    if not include_dirs:
        raise NativeUnavailable(
            "native build: cusparse.h not found under CUDA_HOME or the nvidia wheels; "
            "install the CUDA toolkit's math libraries (or pip install nvidia-cusparse) matching torch's CUDA"
        )
    lib_dirs = _library_dirs("lib", "libcusparse.so*") + _library_dirs("lib64", "libcusparse.so*")
    if not lib_dirs:
        raise NativeUnavailable(
            "native build: libcusparse.so not found under CUDA_HOME or the nvidia wheels; "
            "install the CUDA toolkit's math libraries matching torch's CUDA"
        )
    lib_dir = lib_dirs[0]
    names = sorted(p.name for p in lib_dir.glob("libcusparse.so*"))
    library = "libcusparse.so" if "libcusparse.so" in names else names[0]
    return [str(include_dirs[0])], [f"-L{lib_dir}", f"-l:{library}", f"-Wl,-rpath,{lib_dir}"]


def _build_key(arch: str, include_dirs: list[str], ldflags: list[str]) -> str:
    digest = hashlib.sha256()
    for path in source_files() + _header_files():
        digest.update(path.relative_to(SOURCE_DIR).as_posix().encode())
        digest.update(path.read_bytes())
    facts = [
        BUILD_RECIPE,
        torch.__version__,
        torch.version.cuda,
        nvcc_version(),
        sys.implementation.cache_tag,
        sysconfig.get_config_var("SOABI"),
        platform.machine(),
        arch,
        CXX_FLAGS,
        CUDA_FLAGS,
        include_dirs,
        ldflags,
        os.environ.get("GNNIO_NATIVE_VERBOSE", ""),
    ]
    digest.update(json.dumps(facts, default=str).encode())
    return digest.hexdigest()[:16]


def build_dir() -> Optional[Path]:
    """This environment's build folder, or None when it cannot be known (no CUDA torch, nvcc or arch)."""
    try:
        return _configure()[0]
    except NativeUnavailable:
        return None


def _configure() -> tuple[Path, str, list[str], list[str]]:
    """(build folder, arch list, include dirs, linker flags), or NativeUnavailable saying what is missing."""
    if os.environ.get("GNNIO_NATIVE", "1") == "0":
        raise NativeUnavailable("native kernels disabled by GNNIO_NATIVE=0; unset it to use them")
    if not source_files():
        raise NativeUnavailable(
            f"native sources not found in {SOURCE_DIR}; reinstall gnnio (pip install gnnio, or pip install . in a checkout)"
        )
    if torch.version.cuda is None:
        raise NativeUnavailable(
            f"torch {torch.__version__} is a CPU-only build; install a CUDA build of torch to use the native kernels"
        )
    if _nvcc_path() is None:
        raise NativeUnavailable(
            f"nvcc not found (CUDA_HOME={cuda_home()}); install the CUDA {torch.version.cuda} toolkit "
            "or set CUDA_HOME to it"
        )
    if ninja_version() is None:
        raise NativeUnavailable("ninja not found; pip install ninja")
    arch = arch_list()
    if arch is None:
        raise NativeUnavailable(
            "no GPU visible to pick the arch list; set TORCH_CUDA_ARCH_LIST (e.g. 9.0a for H100/H200)"
        )
    include_dirs, ldflags = _cusparse_flags()
    return cache_root() / _build_key(arch, include_dirs, ldflags), arch, include_dirs, ldflags


@contextmanager
def _build_lock(folder: Path) -> Iterator[None]:
    """An advisory lock the kernel drops when its holder dies: one gnnio build per folder at a time."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "gnnio-build.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def stale_lock(folder: Path) -> Optional[Path]:
    """torch's build lock left by a killed build, which would make the next build wait forever.

    Only torch versions whose lock is a plain file (FileBaton) leave such locks;
    call with gnnio's own build lock held, so no live gnnio build owns it.
    """
    from torch.utils import cpp_extension

    lock = folder / "lock"
    if lock.exists() and hasattr(cpp_extension, "FileBaton"):
        return lock
    return None


def _first_error_line(text: str) -> str:
    for line in text.splitlines():
        if re.search(r"\berror\b", line, re.IGNORECASE) and "Error building extension" not in line:
            return line.strip()[:300]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """The process environment with `values` set, restored afterwards (the build's arch list; the
    switches bench's variants)."""
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def load() -> Path:
    """Build (if needed) and load the extension; its ops appear under ``torch.ops.gnnio``.

    Returns the build folder. Raises :class:`NativeUnavailable` (one line: what is
    missing, what to do) and remembers the reason for :func:`is_available`.
    """
    global _loaded_from, _failure
    with _lock:
        if _loaded_from is not None:
            return _loaded_from
        try:
            _loaded_from = _load_unlocked()
            _failure = None
            return _loaded_from
        except NativeUnavailable as err:
            _failure = str(err)
            raise


def _load_unlocked() -> Path:
    global _build_seconds
    from torch.utils import cpp_extension

    folder, arch, include_dirs, ldflags = _configure()
    verbose = os.environ.get("GNNIO_NATIVE_VERBOSE") == "1"
    cuda_flags = CUDA_FLAGS + (["-Xptxas=-v"] if verbose else [])
    with _build_lock(folder):
        lock = stale_lock(folder)
        if lock is not None:
            raise NativeUnavailable(
                f"stale build lock {lock} left by a killed build: remove it (rm {lock}) and retry"
            )
        record = folder / "build.json"
        started = time.perf_counter()
        with environment({"TORCH_CUDA_ARCH_LIST": arch}):
            try:
                cpp_extension.load(
                    name=EXTENSION_NAME,
                    sources=[str(path) for path in source_files()],
                    extra_cflags=CXX_FLAGS,
                    extra_cuda_cflags=cuda_flags,
                    extra_include_paths=[str(SOURCE_DIR), *include_dirs],
                    extra_ldflags=ldflags,
                    build_directory=str(folder),
                    with_cuda=True,
                    is_python_module=False,
                    verbose=verbose,
                )
            except (RuntimeError, subprocess.CalledProcessError) as err:
                output = getattr(err, "output", None)
                text = str(err) + ("\n" + output.decode(errors="replace") if isinstance(output, bytes) else "")
                (folder / "build.log").write_text(text)
                if "Error building extension" in text or isinstance(err, subprocess.CalledProcessError):
                    raise NativeUnavailable(
                        f"native build failed ({_first_error_line(text)}); full log in {folder / 'build.log'}"
                    ) from err
                raise NativeUnavailable(
                    f"native extension built in {folder} but does not load ({_first_error_line(text)}); "
                    f"delete that folder and retry"
                ) from err
            except OSError as err:
                raise NativeUnavailable(
                    f"native extension in {folder} does not load ({str(err)[:300]}); delete that folder and retry"
                ) from err
        seconds = time.perf_counter() - started
        if record.exists():
            _build_seconds = json.loads(record.read_text()).get("build_seconds")
        else:
            _build_seconds = seconds
            record.write_text(json.dumps({"build_seconds": round(seconds, 1), "arch_list": arch, "built": time.time()}))
    _register_fakes()
    return folder


def is_available() -> bool:
    """Whether the native kernels can run here (builds on first call); never raises."""
    global _failure
    if _loaded_from is not None:
        return True
    if _failure is not None:
        return False
    try:
        load()
        return True
    except NativeUnavailable:
        return False
    except Exception as err:  # a bug in the build path must not break the reference fallback
        _failure = f"native extension unavailable: {type(err).__name__}: {err}"
        return False


def reason() -> Optional[str]:
    """Why the native kernels are unavailable (None when loaded or never tried)."""
    return _failure


def _reset_for_tests() -> None:
    """Forget the cached outcome (tests change the environment between calls)."""
    global _loaded_from, _failure, _build_seconds
    _loaded_from = _failure = _build_seconds = None


def op_names() -> list[str]:
    """The ops registered under torch.ops.gnnio (empty before a load)."""
    names = []
    for schema in torch._C._jit_get_all_schemas():
        if schema.name.startswith("gnnio::"):
            names.append(schema.name.split("::", 1)[1])
    return sorted(set(names))


def _gpu() -> tuple[Optional[str], Optional[str]]:
    if not torch.cuda.is_available():
        return None, None
    major, minor = torch.cuda.get_device_capability()
    return torch.cuda.get_device_name(), f"{major}.{minor}"


def status(build: bool = False) -> NativeStatus:
    """Facts for `gnnio doctor`; with `build`, builds and loads first (never raises)."""
    if build:
        is_available()
    folder = build_dir()
    gpu, capability = _gpu()
    built = folder is not None and any(folder.glob(f"{EXTENSION_NAME}*.so"))
    seconds = _build_seconds
    if seconds is None and folder is not None and (folder / "build.json").exists():
        seconds = json.loads((folder / "build.json").read_text()).get("build_seconds")
    loaded = _loaded_from is not None
    why_not = None if loaded else (_failure or _configure_problem() or "not built yet: run gnnio doctor --build")
    backends = {"reference": "available (pure PyTorch, any device)"}
    if loaded and gpu is not None:
        backends["native"] = "available"
    elif loaded:
        backends["native"] = "built, but no GPU is visible"
    else:
        backends["native"] = f"unavailable: {why_not}"
    return NativeStatus(
        python=platform.python_version(),
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        gpu=gpu,
        gpu_capability=capability,
        cuda_home=cuda_home(),
        nvcc=nvcc_version(),
        ninja=ninja_version(),
        arch_list=arch_list(),
        cache_dir=str(folder) if folder is not None else str(cache_root()),
        built=built,
        build_seconds=seconds,
        loaded=loaded,
        ops=op_names() if loaded else [],
        reason=why_not,
        backends=backends,
    )


def _configure_problem() -> Optional[str]:
    try:
        _configure()
        return None
    except NativeUnavailable as err:
        return str(err)


# ---------------------------------------------------- shapes for the tracer
_fakes_registered = False


def _register_fakes() -> None:
    """Shape-only implementations, so torch.compile and opcheck can trace the ops."""
    global _fakes_registered
    if _fakes_registered:
        return
    _fakes_registered = True

    @torch.library.register_fake("gnnio::segment_sum")
    def _(indptr, indices, values, x, num_rows, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges,
          diagonal=None):
        return x.new_empty((num_rows, x.shape[1]))

    @torch.library.register_fake("gnnio::segment_sum_subwarp")
    def _(indptr, indices, values, x, num_rows, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges,
          row_order, row_scale=None, diagonal=None):
        return x.new_empty((num_rows, x.shape[1]))

    def extremum_outputs(indices, x, num_rows, with_masks):
        slots = indices.shape[0] if with_masks else 0
        return x.new_empty((num_rows, x.shape[1])), x.new_empty((slots, (x.shape[1] + 31) // 32), dtype=torch.int32)

    @torch.library.register_fake("gnnio::segment_extremum_masked")
    def _(indptr, indices, x, num_rows, is_min, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges,
          with_masks=True):
        return extremum_outputs(indices, x, num_rows, with_masks)

    @torch.library.register_fake("gnnio::segment_extremum_masked_subwarp")
    def _(indptr, indices, x, num_rows, is_min, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges,
          row_order, with_masks=True):
        return extremum_outputs(indices, x, num_rows, with_masks)

    @torch.library.register_fake("gnnio::segment_extremum_masked_backward")
    def _(csc_indptr, csc_indices, csc_mask_slot, grad_out, masks, num_src, tile_row, tile_start, heavy_rows,
          heavy_tile_ptr, tile_edges):
        return grad_out.new_empty((num_src, grad_out.shape[1]))

    @torch.library.register_fake("gnnio::graph_facts")
    def _(csr_indptr, csc_indptr, src, dst, tiles):
        return csr_indptr.new_empty(FACTS_WIDTH)

    # the dense products (native/dense.cu)
    @torch.library.register_fake("gnnio::matmul_split_tf32")
    def _(a, a_transposed, b, b_transposed, bias, out_widths, row_sums=False):
        rows = sum(t.shape[1] for t in a) if a_transposed else a[0].shape[0]
        outputs = [a[0].new_empty((rows, width)) for width in out_widths]
        return outputs + ([a[0].new_empty(rows)] if row_sums else [])

    @torch.library.register_fake("gnnio::project_split_tf32")
    def _(x, weights, biases):
        return [x.new_empty((x.shape[0], weight.shape[0])) for weight in weights]

    # the structures derived every mini-batch step (native/graph.cu)
    @torch.library.register_fake("gnnio::append_loops")
    def _(indptr, indices, eid, num_loops):
        return torch.empty_like(indptr), indices.new_empty(indices.shape[0] + num_loops), eid.new_empty(eid.shape[0] + num_loops)

    @torch.library.register_fake("gnnio::row_plan")
    def _(indptr, tile_edges, heavy_rows, tiles, max_degree):
        tile_count = tiles if heavy_rows else 0
        rows = indptr.shape[0] - 1
        return (indptr.new_empty(tile_count), indptr.new_empty(tile_count), indptr.new_empty(heavy_rows),
                indptr.new_empty(heavy_rows + 1), indptr.new_empty((rows - heavy_rows, 3)))

    @torch.library.register_fake("gnnio::slot_map")
    def _(to_eid, from_eid):
        return torch.empty_like(from_eid)

    # the loader's sampling ops (native/sample.cu); the sizes the host passes fix every output's shape
    @torch.library.register_fake("gnnio::sample_seeds")
    def _(table, seeds, indptr, fanout, replace):
        return torch.empty_like(seeds)

    @torch.library.register_fake("gnnio::sample_neighbors")
    def _(indptr, indices, eid, frontier, ends, num_picks, fanout, replace, key):
        return indptr.new_empty(num_picks), indptr.new_empty(num_picks)

    @torch.library.register_fake("gnnio::sample_first_seen")
    def _(table, sources, indptr, next_fanout, replace):
        return sources.new_empty((2, sources.shape[0]))

    @torch.library.register_fake("gnnio::sample_assign")
    def _(table, sources, cumulative, first_local, num_new):
        return sources.new_empty(num_new), sources.new_empty(num_new)

    @torch.library.register_fake("gnnio::sample_relabel")
    def _(table, sources, n_id):
        return torch.empty_like(sources)

    @torch.library.register_fake("gnnio::cusparse_spmm")
    def _(indptr, indices, values, x, num_rows, workspace):
        return x.new_empty((num_rows, x.shape[1]))

    _register_attention_fakes()


def _register_attention_fakes() -> None:
    """The typed attention edge ops of native/attention/<kind>.cu. Each takes the graph arguments of
    native/attention/schema.h (10: indptr, indices, eid, the row schedule and the row order) first; Nd or Ns is
    the rows of that indptr, E the entries of indices."""

    def forward(indptr, indices, rows, return_scores):
        """(out [Nd, H, C] like `rows`, lse fp32 [Nd, H], scores fp32 [E or 0, H])."""
        num_dst, heads = indptr.shape[0] - 1, rows.shape[1]
        scores = rows.new_empty((indices.shape[0] if return_scores else 0, heads), dtype=torch.float32)
        return (rows.new_empty((num_dst, *rows.shape[1:])), rows.new_empty((num_dst, heads), dtype=torch.float32),
                scores)

    def stats(indptr, rows, width=2):
        """row_stats fp32 [Nd, H, width]."""
        return rows.new_empty((indptr.shape[0] - 1, rows.shape[1], width), dtype=torch.float32)

    def node_rows(indptr, rows, per_head=True):
        """[N, H, C] (or [N, H] without per_head) like `rows`, N the rows of indptr."""
        return rows.new_empty((indptr.shape[0] - 1, *(rows.shape[1:] if per_head else rows.shape[1:2])))

    def edge_outputs(indices, rows, edge, write_edge_grads):
        """(grad of edge (or [0]), edge_grads fp32 [E or 0, H])."""
        grad_edge = torch.empty_like(edge) if edge is not None else rows.new_empty(0)
        count = indices.shape[0] if write_edge_grads else 0
        return grad_edge, rows.new_empty((count, rows.shape[1]), dtype=torch.float32)

    # the node-level ops (native/attention/rows.cu)
    @torch.library.register_fake("gnnio::attention_row_norms")
    def _(x):
        return x.new_empty((*x.shape[:2], 2), dtype=torch.float32)

    @torch.library.register_fake("gnnio::attention_row_dots")
    def _(a, b, offset=None, lse=None, column_sums=False, residual=None):
        nodes, heads, channels = a.shape
        dots = a.new_empty((nodes, heads, 2) if lse is not None else (nodes, heads), dtype=torch.float32)
        return dots, a.new_empty((heads if column_sums else 0, channels), dtype=torch.float32)

    @torch.library.register_fake("gnnio::attention_unit_rows_backward")
    def _(x, norm, grad_unit):
        return torch.empty_like(x)

    # GAT: x_src, alpha_src, alpha_dst, edge_alpha
    @torch.library.register_fake("gnnio::gat_attention_forward")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, alpha_src, alpha_dst, edge_alpha, negative_slope, dropout, seed, offset,
          return_scores, bias=None):
        return forward(indptr, indices, x_src, return_scores)

    @torch.library.register_fake("gnnio::gat_attention_forward_edge_balanced")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, alpha_src, alpha_dst, edge_alpha, negative_slope, dropout, seed, offset,
          return_scores, slot_rows, bias=None):
        return forward(indptr, indices, x_src, return_scores)

    @torch.library.register_fake("gnnio::gat_attention_backward_target")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, alpha_src, alpha_dst, edge_alpha, grad_out, lse, negative_slope, dropout, seed,
          offset):
        return node_rows(indptr, x_src, per_head=False), stats(indptr, x_src)

    @torch.library.register_fake("gnnio::gat_attention_backward_source")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, alpha_src, alpha_dst, edge_alpha, grad_out, row_stats, negative_slope, dropout, seed,
          offset, write_edge_grads, packed_grads=None):
        return (node_rows(indptr, x_src), node_rows(indptr, x_src, per_head=False),
                *edge_outputs(indices, x_src, edge_alpha, write_edge_grads))

    @torch.library.register_fake("gnnio::gat_attention_backward_target_from_edges")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, alpha_src, alpha_dst, edge_alpha, edge_grads, edge_grad_slots, packed_grads=None):
        return node_rows(indptr, x_src, per_head=False)

    # GATv2: x_src, x_dst, att, edge
    @torch.library.register_fake("gnnio::gatv2_attention_forward")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, x_dst, att, edge, negative_slope, dropout, seed, offset, return_scores, bias=None):
        return forward(indptr, indices, x_src, return_scores)

    @torch.library.register_fake("gnnio::gatv2_attention_forward_edge_balanced")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, x_dst, att, edge, negative_slope, dropout, seed, offset, return_scores, slot_rows,
          bias=None):
        return forward(indptr, indices, x_src, return_scores)

    @torch.library.register_fake("gnnio::gatv2_attention_backward_target")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, x_dst, att, edge, grad_out, lse, negative_slope, dropout, seed, offset):
        return node_rows(indptr, x_src), torch.empty_like(att), stats(indptr, x_src)

    @torch.library.register_fake("gnnio::gatv2_attention_backward_source")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, x_dst, att, edge, grad_out, row_stats, negative_slope, dropout, seed, offset):
        return node_rows(indptr, x_src), edge_outputs(indices, x_src, edge, False)[0]

    # Dot: query, key, value, edge
    @torch.library.register_fake("gnnio::dot_attention_forward")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, query, key, value, edge, scale, dropout, seed, offset, return_scores, residual=None,
          hinted_indices=None):
        return forward(indptr, indices, value, return_scores)

    @torch.library.register_fake("gnnio::dot_attention_forward_edge_balanced")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, query, key, value, edge, scale, dropout, seed, offset, return_scores, slot_rows,
          residual=None):
        return forward(indptr, indices, value, return_scores)

    @torch.library.register_fake("gnnio::dot_attention_backward_target")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, query, key, value, edge, grad_out, lse, scale, dropout, seed, offset):
        return node_rows(indptr, value), stats(indptr, value)

    @torch.library.register_fake("gnnio::dot_attention_backward_source")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, query, key, value, edge, grad_out, row_stats, scale, dropout, seed, offset,
          write_edge_grads, hinted_indices=None):
        return (node_rows(indptr, value), node_rows(indptr, value),
                *edge_outputs(indices, value, edge, write_edge_grads))

    @torch.library.register_fake("gnnio::dot_attention_backward_target_from_edges")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, query, key, value, edge, edge_grads, edge_grad_slots, hinted_indices=None):
        return node_rows(indptr, value)

    # Cosine: x_src, x_dst, norm_src, norm_dst, beta
    @torch.library.register_fake("gnnio::cosine_attention_forward")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, x_dst, norm_src, norm_dst, beta, dropout, seed, offset, return_scores):
        return forward(indptr, indices, x_src, return_scores)

    @torch.library.register_fake("gnnio::cosine_attention_forward_edge_balanced")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, x_dst, norm_src, norm_dst, beta, dropout, seed, offset, return_scores, slot_rows):
        return forward(indptr, indices, x_src, return_scores)

    @torch.library.register_fake("gnnio::cosine_attention_backward_target")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, x_dst, norm_src, norm_dst, beta, grad_out, lse, dropout, seed, offset):
        return node_rows(indptr, x_src), torch.empty_like(beta), stats(indptr, x_src, 4)

    @torch.library.register_fake("gnnio::cosine_attention_backward_source")
    def _(indptr, indices, eid, tile_row, tile_start, heavy_rows, heavy_tile_ptr, tile_edges, row_order,
          num_busy_rows, x_src, x_dst, norm_src, norm_dst, beta, grad_unit_dst, grad_out, row_stats, dropout, seed,
          offset):
        return node_rows(indptr, x_src)
