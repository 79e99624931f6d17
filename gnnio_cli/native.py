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
- :func:`on_load` runs a kernel family's ``torch.library`` registrations (its
  fake kernels, which live beside the family's binding) once the ops exist.

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
from typing import Callable, Iterator, Optional

import torch

from gnnio_cli.errors import NativeUnavailable
from gnnio_cli.resources import NATIVE_DIR

SOURCE_DIR = NATIVE_DIR
EXTENSION_NAME = "gnnio_native"
# Bump when the way the build is configured changes in a way the hash below misses.
BUILD_RECIPE = 1

CXX_FLAGS = ["-O3"]
CUDA_FLAGS = ["-O3", "-lineinfo"]

_lock = threading.Lock()
_loaded_from: Optional[Path] = None
_failure: Optional[str] = None
_build_seconds: Optional[float] = None
# on_load's registrations not run yet (each runs once per process, however often load() runs)
_pending: list[Callable[[], None]] = []


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
    while _pending:
        _pending.pop(0)()
    return folder


def on_load(register: Callable[[], None]) -> Callable[[], None]:
    """Run `register` once the extension's ops exist: now if it is loaded, else right after :func:`load` loads it.

    For a kernel family's torch.library registrations (its fake kernels): torch.library.register_fake needs
    the op's schema, which the extension's TORCH_LIBRARY blocks define as it loads. Each family module
    decorates its registrations with this at import, so they precede any call of its ops from gnnio's code;
    without the extension (a CPU-only torch) they never run. Returns `register`, so it works as a decorator.
    """
    with _lock:
        if _loaded_from is None:
            _pending.append(register)
            return register
    register()
    return register


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
