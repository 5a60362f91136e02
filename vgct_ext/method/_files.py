"""Files shared between processes: evidence JSON and the ``--vgct-report``. Private.

* :func:`locked` -- an inter-process lock (the ``filelock`` library) held around every read-merge-write of a
  shared file, so two writers (pytest-xdist workers, two terminals, CI jobs on one checkout) never lose each
  other's entries.
* :func:`atomic_write_text` -- the new content goes to a unique temporary file in the target's directory
  (``tempfile.mkstemp``), is flushed and ``fsync``-ed, then renamed over the target (``os.replace``, atomic on
  POSIX and Windows); the directory is ``fsync``-ed after the rename. A reader sees the old file or the new
  one, never a torn one; a full disk or any other error leaves the old file untouched and removes the
  temporary file.
* :func:`check_writable` -- whether a file can be created at a path (used at startup for ``--vgct-report``).

A writer killed between creating its temporary file and the rename (SIGKILL, a power cut) leaves that file
behind (``.<name>.XXXXXXXX.tmp``, git-ignored); whoever next takes the lock of ``<name>`` removes those older
than :data:`ORPHAN_AGE_S` (every writer of an evidence file holds its lock while its temporary file exists, so
such a file under the lock is an orphan; the age spares a writer that does not lock, such as the report's).

A path that is a symbolic link (an evidence file shared by several checkouts) is written through: the lock and
the temporary file are the link target's, and the rename replaces the target, not the link -- replacing the
link by a regular file left every other checkout gating on the stale target (hostile review of 2026-12-05).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import tempfile
import time
from pathlib import Path
from typing import Iterator, Union

__all__ = ["LOCK_SUFFIX", "LOCK_TIMEOUT_S", "locked", "check_lockable", "atomic_write_text", "check_writable"]

LOCK_SUFFIX = ".lock"
LOCK_TIMEOUT_S = 300.0
#: A temporary file of a locked file older than this (seconds) is an orphan (the module docstring).
ORPHAN_AGE_S = 60.0
_MKSTEMP_NAME = re.compile(r"[a-z0-9_]{8}\.(tmp|probe)")  # (tempfile's names: 8 characters of this set)

PathLike = Union[str, "os.PathLike[str]"]


@contextlib.contextmanager
def locked(path: PathLike, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the inter-process lock of ``path`` (the file ``<path>.lock``; for a symbolic link, its target's) for
    the ``with`` block.

    Raises ``TimeoutError`` naming the lock file when another process holds it for more than ``timeout``
    seconds (``filelock.Timeout`` is a ``TimeoutError``); ``OSError`` (``ELOOP``) naming it when the lock file
    itself is a symbolic link, which the lock does not follow (filelock's ``O_NOFOLLOW`` gave a bare "Too many
    levels of symbolic links" that said neither what nor why); ``FileNotFoundError`` / ``NotADirectoryError``
    naming the path when its folder does not exist or a component of it is a file (filelock made the missing
    folders -- a typo became a new tree -- or said "File exists"); ``OSError`` with the reason when the lock file
    cannot be created (a read-only place: filelock retried it as if another process held it, for ``timeout``
    seconds -- new-user trial of 2026-12-05)."""
    from filelock import FileLock

    lock = check_lockable(path)
    with FileLock(lock, timeout=timeout):
        _remove_orphans(lock[:-len(LOCK_SUFFIX)])
        yield


def check_lockable(path: PathLike) -> str:
    """The lock file of ``path`` (for a symbolic link, its target's), after checking that it can be taken -- what
    :func:`locked` raises, without waiting (a calibration checks at its first run, not when the session ends
    with every run measured): ``OSError`` (``ELOOP``) when the lock file is a symbolic link;
    ``FileNotFoundError`` / ``NotADirectoryError`` when the folder does not exist or a component is a file;
    ``OSError`` with the reason when the lock file cannot be created (a read-only place)."""
    target = os.path.realpath(path)  # (a link: its target's lock)
    lock = target + LOCK_SUFFIX
    if os.path.islink(lock):  # (refused here, whatever the filelock: one that followed it would lock its target)
        raise OSError(errno.ELOOP, f"the lock file {lock} is a symbolic link (to {os.readlink(lock)}), which the "
                      f"evidence lock does not follow; remove the link (a lock file holds no data: the next writer "
                      f"creates it again)", lock)
    _check_folder(target)
    try:  # (whether it can be made at all: filelock treats every failure to open it as "held by another")
        os.close(os.open(lock, os.O_RDWR | os.O_CREAT, 0o666))
    except OSError as exc:
        raise OSError(exc.errno, f"cannot create the lock file {lock} ({exc.strerror}), so nothing can be written "
                      f"beside it: a read-only place, or a path that is not a file", lock) from None
    return lock


def _check_folder(target: str) -> None:
    """Raise unless the folder of ``target`` exists: ``NotADirectoryError`` naming the first component that is a
    file, ``FileNotFoundError`` naming the missing folder (nothing is created: a mistyped path is an error, not a
    new tree of folders)."""
    folder = os.path.dirname(target) or "."
    if os.path.isdir(folder):
        return
    probe = folder
    while probe and not os.path.lexists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if probe and os.path.lexists(probe) and not os.path.isdir(probe):
        raise NotADirectoryError(errno.ENOTDIR, f"{probe} is not a folder, so {target} cannot be written under it",
                                 probe)
    raise FileNotFoundError(errno.ENOENT, f"the folder {folder} of {target} does not exist; create it first (a "
                            f"mistyped path is not made into new folders)", folder)


def _remove_orphans(target: str) -> None:
    """Remove the temporary files of ``target`` (``.<name>.XXXXXXXX.tmp`` / ``.probe``: :func:`atomic_write_text`,
    :func:`check_writable`) last modified more than :data:`ORPHAN_AGE_S` ago; best effort (errors ignored)."""
    folder, name = os.path.split(target)
    prefix = f".{name}."
    now = time.time()
    try:
        entries = list(os.scandir(folder or "."))
    except OSError:
        return
    for e in entries:
        if not (e.name.startswith(prefix) and _MKSTEMP_NAME.fullmatch(e.name[len(prefix):])):
            continue
        with contextlib.suppress(OSError):
            st = e.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and now - st.st_mtime > ORPHAN_AGE_S:
                os.unlink(e.path)


def _mode_for(path: Path) -> int:
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write_text(path: PathLike, text: str) -> None:
    """Replace ``path`` by ``text`` (UTF-8) atomically: unique temporary file in the same directory, fsync,
    ``os.replace``, fsync of the directory. Keeps the permission bits of an existing file (else 0666 & ~umask).
    Raises ``OSError`` (the old file, if any, is then intact and no temporary file is left). A symbolic link
    is written through (its target is replaced; the link stays). A file made read-only is not overwritten
    (``PermissionError``), as :func:`check_writable` promises: ``os.replace`` needs only the directory to be
    writable, so without this check it would replace it."""
    p = Path(os.path.realpath(path))
    if p.exists() and not os.access(p, os.W_OK):
        raise PermissionError(f"{p} exists and is not writable (a read-only file is not overwritten)")
    mode = _mode_for(p)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=str(p.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError, AttributeError):  # directory fsync: POSIX only
        dfd = os.open(str(p.parent), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def check_writable(path: PathLike) -> None:
    """Raise ``OSError`` (with the reason) unless a file can be written at ``path``: creates missing parent
    directories, refuses a directory at ``path``, and proves the directory writable by creating and removing a
    temporary file in it."""
    p = Path(path)
    if p.is_dir():
        raise IsADirectoryError(f"{p} is a directory")
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".probe", dir=str(p.parent))
    os.close(fd)
    os.unlink(tmp)
    if p.exists() and not os.access(p, os.W_OK):
        # os.replace could replace it (the directory is writable), but a file made read-only is not overwritten
        raise PermissionError(f"{p} exists and is not writable")
