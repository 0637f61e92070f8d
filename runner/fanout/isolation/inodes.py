"""What can keep a tree's entries from being removed besides their permissions: the
inode flags chattr sets (immutable, append-only: ``FS_IOC_GETFLAGS``, cleared with
``FS_IOC_SETFLAGS``, which only root may do) and the mount points this process sees
(``/proc/self/mountinfo``).  Only the standard library (see ``removal``)."""

from __future__ import annotations

import fcntl
import os
import stat
import sys

# linux/fs.h.  The ioctl takes an int; an 8-byte buffer fits the "long" its number says.
_GETFLAGS = 0x80086601
_SETFLAGS = 0x40086602
_LOCKED = 0x00000010 | 0x00000020  # FS_IMMUTABLE_FL | FS_APPEND_FL


def unlock(fd: int) -> bool:
    """Clear the immutable and append-only flags of what ``fd`` is open on; False if
    they stay (only root may clear them), True if cleared or never set."""
    buffer = bytearray(8)
    try:
        fcntl.ioctl(fd, _GETFLAGS, buffer)
    except OSError:
        return True  # a filesystem without flags, or nothing this could change
    flags = int.from_bytes(buffer[:4], sys.byteorder)
    if not flags & _LOCKED:
        return True
    cleared = bytearray((flags & ~_LOCKED).to_bytes(4, sys.byteorder) + bytes(4))
    try:
        fcntl.ioctl(fd, _SETFLAGS, cleared)
    except PermissionError:
        return False
    except OSError:
        pass  # what removing it says next is the reason
    return True


def unlock_at(fd: int, name: str) -> bool:
    """``unlock`` for ``name`` in the folder open as ``fd``, if it is a regular file or
    a folder: only those carry the flags (chattr refuses the rest, and opening a
    device would talk to its driver)."""
    try:
        mode = os.lstat(name, dir_fd=fd).st_mode
    except OSError:
        return True
    if stat.S_ISDIR(mode):
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    elif stat.S_ISREG(mode):
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    else:
        return True
    try:
        entry = os.open(name, flags, dir_fd=fd)
    except OSError:
        return True
    try:
        return stat.S_IFMT(os.fstat(entry).st_mode) != stat.S_IFMT(mode) or unlock(entry)
    finally:
        os.close(entry)


def mount_points() -> list[str]:
    """Every mount point this process sees, its octal escapes undone."""
    try:
        with open("/proc/self/mountinfo", "rb") as stream:
            lines = stream.read().splitlines()
    except OSError:
        return []
    points = []
    for line in lines:
        fields = line.split(b" ")
        if len(fields) > 4:
            points.append(os.fsdecode(_unescape(fields[4])))
    return points


def _unescape(field: bytes) -> bytes:
    out = bytearray()
    index = 0
    while index < len(field):
        if field[index : index + 1] == b"\\" and field[index + 1 : index + 4].isdigit():
            out.append(int(field[index + 1 : index + 4], 8))
            index += 4
        else:
            out += field[index : index + 1]
            index += 1
    return bytes(out)
