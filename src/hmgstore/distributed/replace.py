"""A folder written whole or not at all: :func:`new_folder`.

Writers of several files (the parts of a partition) write into a fresh
temporary folder beside the target, then put it in place with one rename.
A reader of the target sees the old files or the new ones, never a mix,
and a writer that fails or is killed half-way leaves the old files as they
were. A writer stopped by SIGTERM removes its folder too; one killed (SIGKILL) leaves its hidden
``.NAME.partial-HOST-PID-*`` folder behind, which the next writer of the same target on that host removes.

A target that does not exist, or an empty folder, is replaced by one
``rename``. A folder that holds anything is refused unless ``overwrite``;
then the two folders are exchanged in one atomic step where the system
can (Linux ``renameat2(RENAME_EXCHANGE)``, on ext4, xfs, btrfs, tmpfs), else
by two renames, between which the target is briefly absent (a reader gets
FileNotFoundError, never a mix). The old folder is then deleted.
"""
from __future__ import annotations

import ctypes
import errno
import glob
import logging
import os
import secrets
import shutil
import signal
import socket
import stat
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..memory.shared import process_alive

log = logging.getLogger(__name__)

_AT_FDCWD, _RENAME_EXCHANGE = -100, 2  # from <fcntl.h> and <linux/fs.h>


@contextmanager
def new_folder(target, *, overwrite: bool = False, keep=()) -> Iterator[Path]:
    """A new empty folder beside ``target`` to write into; when the block ends without an exception it
    replaces ``target`` whole, else it is deleted and ``target`` is left as it was.

    Raises (before anything is written) what :func:`check_target` raises.
    """
    target = check_target(target, overwrite, keep)
    target.parent.mkdir(parents=True, exist_ok=True)
    _sweep_partial(target)
    new = _made_like(target)
    previous = _raise_on_sigterm()
    try:
        yield new
        _put_in_place(new, target, overwrite)
    except BaseException as err:
        shutil.rmtree(new, ignore_errors=True)  # the new files, or after an exchange the old ones
        if isinstance(err, _Terminated):  # cleaned up: now end as SIGTERM ends a process, threads or not
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _partial_prefix(target: Path) -> str:
    return f".{target.name}.partial-"


def _sweep_partial(target: Path) -> None:
    """Remove the hidden folders that writers of ``target`` on this host left when they were killed (SIGKILL: no
    cleanup runs): ``.NAME.partial-HOST-PID-TOKEN``, whose process is gone. Pids are this PID namespace's: writers
    in containers that share a hostname but not their pids (``--network host``) look gone to each other, so such
    containers must not write the same target at once (they would replace each other's output anyway)."""
    host, prefix = socket.gethostname(), _partial_prefix(target)
    for path in target.parent.glob(glob.escape(prefix) + "*"):
        try:
            writer, pid_text, _ = path.name[len(prefix):].rsplit("-", 2)
            pid = int(pid_text)
        except ValueError:  # another name (an exchange's "-old" folder holds a user's earlier output): left alone
            continue
        if writer == host and not process_alive(pid):
            log.warning("hmgstore: removing %s, which a writer (pid %d) killed half-way left", path, pid)
            shutil.rmtree(path, ignore_errors=True)


class _Terminated(BaseException):
    """SIGTERM came while a folder was written: raised to remove the half-written folder, then the signal is
    sent again with its default action, so the process ends as SIGTERM would have ended it."""


def _raise_on_sigterm():
    """While a folder is written, SIGTERM (timeout, Slurm, Kubernetes) raises :class:`_Terminated` in the main
    thread, so that the half-written folder is removed; returns the handler to put back, or None where none was
    changed (not the main thread, or the program handles SIGTERM itself)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None
    return signal.signal(signal.SIGTERM, _terminated)


def _terminated(signum, frame) -> None:
    raise _Terminated


def _made_like(target: Path) -> Path:
    """A new hidden folder beside ``target`` with the mode a folder made there by hand gets (the umask's, and the
    parent's set-group-id), or the mode of the folder ``target`` it replaces: others who read the parts (on
    shared storage) keep reading them. ``tempfile.mkdtemp`` would make it private (0700)."""
    while True:
        new = target.parent / f"{_partial_prefix(target)}{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.mkdir(new)
            break
        except FileExistsError:
            continue
    if target.is_dir():
        os.chmod(new, stat.S_IMODE(target.stat().st_mode))
    return new


def check_target(target, overwrite: bool, keep=()) -> Path:
    """``target`` as the absolute folder a writer may replace (a link to a folder: the folder it names).

    Raises NotADirectoryError when it is a file, FileExistsError when it is a folder that holds anything and
    ``overwrite`` is False, and, with ``overwrite``, when replacing it would delete the folder the process runs
    in (an empty or ``.`` target, as an unset shell variable gives) or one of ``keep``, the paths the writer
    reads (its inputs).
    """
    target = Path(os.path.abspath(target))
    target = target.resolve() if target.is_symlink() else target  # replace the folder, keep the link
    _refuse(target, overwrite, keep)
    return target


def _holds(folder: Path, path: Path) -> bool:
    path = path.resolve()
    return path == folder.resolve() or folder.resolve() in path.parents


def _refuse(target: Path, overwrite: bool, keep=()) -> None:
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"{target} is a file, not a folder to write into")
    above = next((p for p in target.parents if p.exists()), None)  # the folder it would be made in
    if above is not None and not above.is_dir():
        raise NotADirectoryError(f"{above} is a file, so no folder can be made under it")
    if not target.is_dir() or not any(target.iterdir()):
        return
    if not overwrite:
        held = sorted(p.name for p in target.iterdir())
        shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
        raise FileExistsError(f"{target} is not empty (it holds {shown}); pass overwrite=True (--overwrite) "
                              "to replace it and everything in it, or choose an empty folder")
    if _holds(target, Path.cwd()):
        raise FileExistsError(f"{target} holds the folder this process runs in ({Path.cwd()}): overwriting it would "
                              "delete it. Name a folder of the output's own (an empty or '.' one is what an unset "
                              "variable gives)")
    for path in keep:
        if path is not None and _holds(target, Path(path)):
            raise FileExistsError(f"{target} holds {path}, which this run reads: overwriting it would delete it. "
                                  "Write the output to another folder")


def _put_in_place(new: Path, target: Path, overwrite: bool) -> None:
    try:
        os.rename(new, target)  # target absent or an empty folder: one atomic step
        return
    except OSError as err:
        if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        _refuse(target, overwrite)  # filled since we looked: refused as it would have been then
    if _exchange(new, target):
        shutil.rmtree(new, ignore_errors=True)  # now the old folder
        return
    old = new.with_name(new.name + "-old")
    os.rename(target, old)
    try:
        os.rename(new, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)
    if old.exists():
        log.warning("could not delete the replaced folder %s; delete it by hand", old)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step; False where the system or file system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2  # glibc 2.28 and later
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    log.debug("renameat2(RENAME_EXCHANGE) failed (%s); replacing %s with two renames", os.strerror(ctypes.get_errno()),
              b)
    return False
