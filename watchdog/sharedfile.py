"""Small files in a directory other users can write to (the shared run directory):
how the monitor writes one and when it believes one.

Writing: another user can plant a symlink at any name they can guess, so a plain
``open(name + ".tmp", "w")`` by a privileged agent writes wherever the link
points. Here the file is created through the directory's fd under an
unpredictable name, with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (a planted name, link
or not, fails the create instead of being followed), then renamed into place
within the same directory (a rename replaces a link at the final name, never
follows it; in a sticky directory it cannot replace another user's file).

Reading: a file is believed only when it is a regular file, not a link
(``O_NOFOLLOW``), and owned by one of the uids that may have written it;
anything else is ``Untrusted`` (an OSError: to a caller, as good as no file), with the reason.
"""

from __future__ import annotations

import os
import secrets
import stat

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
MAX_BYTES = 1 << 20


class Untrusted(OSError):
    """The file exists but is not to be believed (a link, not regular, another owner, too big)."""


def write(directory: str, name: str, data: bytes, mode: int = 0o644) -> None:
    """Replace ``directory/name`` with ``data`` atomically, never through a link."""
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    try:
        tmp = f".{name}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, mode, dir_fd=dfd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
    finally:
        os.close(dfd)


def read(path: str, owners: frozenset[int], max_bytes: int = MAX_BYTES) -> bytes:
    """The content of ``path`` if it is a regular file, not a link, owned by one
    of ``owners`` and at most ``max_bytes``; else ``Untrusted`` (or OSError: missing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC)
    except OSError as exc:
        if os.path.islink(path):
            raise Untrusted(f"{path} is a symbolic link") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted(f"{path} is not a regular file")
        if st.st_uid not in owners:
            raise Untrusted(f"{path} is owned by uid {st.st_uid}, not by {sorted(owners)}")
        if st.st_size > max_bytes:
            raise Untrusted(f"{path} is {st.st_size} bytes, over {max_bytes}")
        chunks, left = [], st.st_size
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
