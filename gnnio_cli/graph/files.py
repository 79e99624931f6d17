"""Output files: written atomically, and never over a file gnnio did not make.

Every file gnnio writes (graphs, edge lists) is written to a temporary file
beside its destination, ``.<name>.gnnio-<host>-<pid>-<random>.tmp``, flushed
and renamed over the destination only once complete, so a reader sees the
old file or the new one, never half of one. On the way out the temporary file
is removed: after any error, and after SIGINT, SIGTERM or SIGHUP (the CLI turns
those into exceptions). A process that cannot act (SIGKILL, a power cut)
leaves it behind; the next write into the same folder removes it once the
process named in it is gone. Temporary files of other hosts are left alone
(their processes cannot be checked from here).

New files get mode 0666 less the umask, as any file the user creates.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from gnnio_cli.errors import GnnioError

_HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]
_TEMPORARY = re.compile(r"^\..+\.gnnio-(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-[0-9a-f]+\.tmp$")
# What gnnio 0.1's tempfile.mkstemp left: ".NAME.h5.XXXXXXXX.tmp", no owner recorded.
_UNOWNED_TEMPORARY = re.compile(r"^\..+\.h5\.[a-z0-9_]{8}\.tmp$")
# An unowned temporary file this long untouched belongs to no running conversion.
UNOWNED_STALE_SECONDS = 3600


def temporary_name(path: Path) -> Path:
    """A fresh temporary path beside `path` that names this host and process."""
    return path.with_name(f".{path.name}.gnnio-{_HOST}-{os.getpid()}-{secrets.token_hex(4)}.tmp")


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def _is_stale(entry: os.DirEntry) -> bool:
    owned = _TEMPORARY.match(entry.name)
    if owned:
        return owned["host"] == _HOST and not _process_alive(int(owned["pid"]))
    if _UNOWNED_TEMPORARY.match(entry.name):
        try:
            return time.time() - entry.stat(follow_symlinks=False).st_mtime > UNOWNED_STALE_SECONDS
        except OSError:
            return False
    return False


def sweep_stale_temporaries(folder: Path) -> list[str]:
    """Remove the temporary files in `folder` left by gnnio processes that are gone; returns their names."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if entry.name.endswith(".tmp") and entry.is_file(follow_symlinks=False) and _is_stale(entry):
            try:
                os.unlink(entry.path)
                removed.append(entry.name)
            except OSError:
                pass  # removed meanwhile, or not ours to remove: either way nothing to do
    return removed


def check_readable(path: Path | str, kind: str) -> Path:
    """`path` as a Path if it names an existing file this process may read, else a one-line
    GnnioError; `kind` says what a folder is not (e.g. "an edge list")."""
    path = Path(path)
    if not path.exists():
        raise GnnioError(f"{path}: no such file")
    if path.is_dir():
        raise GnnioError(f"{path}: is a folder, not {kind}")
    if not os.access(path, os.R_OK):
        raise GnnioError(f"{path}: permission denied")
    return path


def check_destination(
    path: Path | str, option: str, is_ours: Callable[[Path], bool], kind: str, force: bool = False
) -> Path:
    """Fail early, before any work, if `path` cannot be written or must not be replaced.

    option: how the user named the path (e.g. "-o"), for the messages.
    is_ours(path): whether an existing file is one gnnio made (of `kind`, e.g.
    "gnnio graph"); anything else is replaced only with `force`.
    """
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        raise GnnioError(f"{option} {path}: is a folder; name a file")
    if not folder.is_dir():
        raise GnnioError(f"{option} {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise GnnioError(f"{option} {path}: cannot write into folder {folder} (permission denied)")
    if path.exists() and not force and not is_ours(path):
        raise GnnioError(f"{option} {path}: exists and is not {kind}; add --force to replace it")
    return path


def _create(tmp: Path) -> None:
    """Create `tmp` exclusively, with mode 0666 less the umask."""
    os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))


def _sync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable; some file systems cannot, which costs only durability."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def _commit(tmp: Path, path: Path) -> None:
    """Flush the complete temporary file, rename it over `path`, and make the rename durable."""
    with open(tmp, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _sync_folder(path.parent)


def describe_os_error(err: OSError) -> str:
    if err.errno == errno.ENOSPC:
        return "no space left on the device"
    return err.strerror or str(err)


@contextmanager
def atomic_path(path: Path | str, what: str = "the file") -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it over `path` only if the block succeeds.

    The temporary file is removed on any exception (KeyboardInterrupt and
    the CLI's signal exceptions included). Stale temporaries in the folder
    are swept first. OSErrors become one-line GnnioErrors naming `path`.
    """
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        raise GnnioError(f"{path}: folder {folder} does not exist")
    sweep_stale_temporaries(folder)
    tmp = temporary_name(path)
    try:
        _create(tmp)
    except OSError as err:
        raise GnnioError(f"{path}: could not write {what}: {describe_os_error(err)}") from None
    try:
        yield tmp
        _commit(tmp, path)
    except OSError as err:
        raise GnnioError(f"{path}: could not write {what}: {describe_os_error(err)}") from err
    finally:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
