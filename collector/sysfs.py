"""Reading sysfs and cgroupfs files as root: small, regular, never through a symlink, never blocking."""

from __future__ import annotations

import errno
import os
import stat

MAX_READ = 4096  # bytes read from one sysfs file, at most
OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
OPEN_DIR = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC


class SysfsReadError(Exception):
    """A short reason why a file was not read; `permission` tells a caller to add its own hint."""

    def __init__(self, reason: str, *, permission: bool = False) -> None:
        super().__init__(reason)
        self.permission = permission


def read_bounded(name: str, dir_fd: int | None = None, limit: int = MAX_READ) -> bytes:
    """At most `limit` bytes of a regular file; a longer file is refused rather than silently cut."""
    try:
        fd = os.open(name, OPEN_FILE, dir_fd=dir_fd)
    except FileNotFoundError:
        raise SysfsReadError("vanished") from None
    except PermissionError:
        raise SysfsReadError("permission denied", permission=True) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SysfsReadError("is a symlink: not followed") from None
        raise SysfsReadError(f"open failed: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SysfsReadError("not a regular file")
        data = os.read(fd, limit + 1)
    except OSError as exc:
        raise SysfsReadError(f"read failed: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise SysfsReadError(f"longer than {limit} bytes")
    return data
