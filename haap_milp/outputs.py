"""Output paths: checked before any work starts, written whole or not at all.

* ``check_output_file(path, flag)`` / ``check_output_dir(path, flag)`` run at the start of every command
  that writes, so a wrong ``--json``/``--plot``/``--out`` fails in milliseconds with exit 2 instead of
  after a solve. They check that the parent folder exists and is writable, that a file is not expected
  where a folder is (and the reverse), and that the target itself is writable when it exists.
* ``write_atomic(path, data)`` writes a temporary file in the same folder, flushes it, then
  ``os.replace``-s it over the target: a reader never sees half a file, and a failed write (disk full,
  ``/dev/full``) leaves the old file untouched. Special files (``/dev/stdout``, ``/dev/null``, FIFOs)
  are written directly since they cannot be renamed over.
* ``write_dir_atomic(folder, files)`` writes a set of files (a launch folder, a plot folder) into a
  temporary folder beside the target, then moves them in. Policy for an existing folder: it is kept and
  only haap's own files (the names being written) are replaced, each by a rename, after all of them were
  written successfully; other files in it are left alone. If writing any file fails, nothing in the
  target changes.

Every failure is a ``HaapInputError`` naming the flag and the path as the user typed them.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from haap_milp.errors import HaapInputError

__all__ = ["check_output_dir", "check_output_file", "write_atomic", "write_dir_atomic"]


def _fail(flag: str, path: str | Path, why: str) -> HaapInputError:
    return HaapInputError(f"{flag} {str(path)!r}: {why}.", field=flag.lstrip("-"), value=str(path))


def _special(p: Path) -> bool:
    """A character device, FIFO or socket (e.g. /dev/stdout, /dev/null, /dev/full)."""
    try:
        mode = p.stat().st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _parent_ok(p: Path, flag: str, shown: str | Path) -> None:
    parent = p.parent if str(p.parent) else Path(".")
    try:
        if not parent.exists():
            raise _fail(flag, shown, f"folder {str(parent)!r} does not exist; create it first")
        if not parent.is_dir():
            raise _fail(flag, shown, f"{str(parent)!r} is a file, not a folder")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise _fail(flag, shown, f"folder {str(parent)!r} is not writable")
    except OSError as exc:  # name too long, permission denied on stat
        raise _fail(flag, shown, f"cannot use this path ({exc.strerror or exc})") from None


def check_output_file(path: str | Path, flag: str) -> Path:
    """``path`` can be written as one file (``-`` is left to the caller: stdout)."""
    text = str(path)
    if not text or "\x00" in text:
        raise _fail(flag, text, "give a file name")
    p = Path(text)
    try:
        if p.is_dir():
            raise _fail(flag, text, "is a folder; give a file name (e.g. plan.json)")
        if _special(p):
            return p  # written directly; a failing device (/dev/full) is reported when written
        if p.exists() and not os.access(p, os.W_OK):
            raise _fail(flag, text, "exists and is not writable")
    except OSError as exc:
        raise _fail(flag, text, f"cannot use this path ({exc.strerror or exc})") from None
    _parent_ok(p, flag, text)
    return p


def check_output_dir(path: str | Path, flag: str) -> Path:
    """``path`` is a folder that exists and is writable, or one that can be created in a writable parent."""
    text = str(path)
    if not text or "\x00" in text:
        raise _fail(flag, text, "give a folder name")
    if text == "-":  # ('-' is stdout for --json; a folder named '-' is not what that spelling means anywhere else)
        raise _fail(flag, text, "takes a folder, not stdout; give a folder name (it is created if missing)")
    p = Path(text)
    try:
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                raise _fail(flag, text, "is a file, not a folder; give a folder name (it is created if missing)")
            if not os.access(p, os.W_OK | os.X_OK):
                raise _fail(flag, text, "folder is not writable")
            return p
    except OSError as exc:
        raise _fail(flag, text, f"cannot use this path ({exc.strerror or exc})") from None
    # a missing folder is created with its missing parents; the nearest existing ancestor must be writable
    anc = p.absolute().parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise _fail(flag, text, f"{str(anc)!r} is a file, not a folder")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise _fail(flag, text, f"folder {str(anc)!r} is not writable")
    return p


def _as_bytes(data: str | bytes) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else data


def write_atomic(path: str | Path, data: str | bytes, *, flag: str = "output", mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` whole or not at all (temporary file + ``os.replace``)."""
    p = Path(path)
    payload = _as_bytes(data)
    try:
        if _special(p):
            with open(p, "wb") as fh:
                fh.write(payload)
                fh.flush()
            return p
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=str(p.parent) or ".")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, mode if mode is not None else 0o644)
            os.replace(tmp, p)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise _fail(flag, path, f"could not be written ({exc.strerror or exc}); nothing was written") from None
    return p


def write_dir_atomic(folder: str | Path, files: Mapping[str, str | bytes | Callable[[Path], None]], *,
                     flag: str = "--out", modes: Mapping[str, int] | None = None) -> list[Path]:
    """Write ``files`` (name -> text/bytes, or a callable that writes the file at the path it is given)
    into ``folder``: all into a temporary sibling folder first, then each renamed into place. A failure
    before the renames leaves ``folder`` as it was. Returns the final paths in ``files`` order."""
    target = Path(folder)
    modes = modes or {}
    for name in files:
        if not name or "/" in name or "\\" in name or name in (".", ".."):
            raise ValueError(f"output file name {name!r} is not a plain file name")  # programming error
    created = False
    try:
        if not target.exists():
            target.mkdir(parents=True)
            created = True
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name or 'out'}.", suffix=".tmp", dir=str(target.parent)))
    except OSError as exc:
        raise _fail(flag, folder, f"folder could not be created ({exc.strerror or exc}); nothing was written") \
            from None
    try:
        for name, content in files.items():
            dest = tmp / name
            if callable(content):
                content(dest)
            else:
                dest.write_bytes(_as_bytes(content))
            os.chmod(dest, modes.get(name, 0o644))
        for name in files:
            if (target / name).is_dir():
                raise _fail(flag, folder, f"{name!r} inside it is a folder; remove it or choose another folder")
        for name in files:
            os.replace(tmp / name, target / name)
    except OSError as exc:
        if created:
            shutil.rmtree(target, ignore_errors=True)
        raise _fail(flag, folder, f"could not be written ({exc.strerror or exc}); nothing was written") from None
    except BaseException:
        if created:
            shutil.rmtree(target, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [target / name for name in files]
