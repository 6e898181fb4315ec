# kernelbox file helper: file operations inside a kernel's container, run by the host with the
# engine's exec API as `python3 -I -S -c <this file> serve [--channel]` as the kernel's
# user, in the kernel's container (its namespaces, cgroup and limits). Standard library only.
# One helper serves requests one after another until EOF on its channel: the host keeps one
# resident per kernel while files are used, and runs a one-shot one beside it when it is busy
# (docs/files.md "Files in and out of a kernel").
#
# The channel: with --channel, the first line on stdin is `SOCKET TOKEN` (never on the command
# line, which host users can read); the helper connects to that Unix socket (the host listens
# on it in the directory it bind-mounts read-only at /run/kernelbox), sends TOKEN, and writes
# `Y` on stdout; requests, uploads and answers then all go over the socket, and stdout carries
# nothing more. When it cannot connect (a kernel made without that directory) it writes `N`
# and, as without --channel, uses stdin and stdout as below.
#
# Every path is a JSON list of plain names relative to /work. It is walked one component at a
# time with os.open(name, O_NOFOLLOW | O_DIRECTORY, dir_fd=parent) from /work, so a symlink
# anywhere on the way (planted by a cell, to / or /proc/1/environ) is refused, never followed,
# and no name can climb out ("..", ".", "/" in a name are refused before any open). The
# final name is opened with O_NOFOLLOW too, and written only by rename over it (a rename
# replaces a symlink, it does not write through it).
#
# Protocol (docs/architecture.md "File transport"):
#   in      a request: a 4-byte big-endian length and that many bytes of JSON
#           {"op": "write"|"untar"|"read"|"tar"|"remove"|"stat"|"mkdir"|"move", "path": [names]}
#           (`move` also has "to": [names]). For `write` and
#           `untar`, once the helper acknowledged it (an A frame), the upload: frames of a
#           4-byte big-endian length and that many bytes; a zero-length frame ends it. EOF
#           before it aborts: nothing is left. EOF between requests ends the helper.
#   out     frames of a 1-byte kind, a 4-byte big-endian length and that many bytes:
#           A (empty: send the upload), H (a read's JSON header: {"kind": "file", "size"},
#           {"kind": "dir", "entries", "truncated"} or {"kind": "tar"}), D (data of a read) and
#           S, the JSON status that ends every request: {"ok": true, ...} or
#           {"ok": false, "code", "message"}. `stat` answers {"ok": true, "entry"} (an entry as a
#           listing's, of the name itself, a symlink not followed), `mkdir` {"ok": true,
#           "created": bool} (parents made; an existing directory is not an error), `move`
#           renames `path` to `to` (the destination's parents made, an existing file there
#           replaced).
#   A helper that could not consume exactly its request (an upload refused or failed after
#   its A, an unexpected error) ends after its status; the host never reuses it.
import errno
import json
import os
import socket
import stat
import sys
import time

WORK = "/work"
# The channel's ends: stdin and stdout, or both the socket (`connect`).
IN = 0
OUT = 1
# The socket, when the channel is one (kept open for the helper's life).
CHANNEL = []
# Seconds connecting to the socket may take.
CONNECT_TIMEOUT = 5
CHUNK = 1024 * 1024
# Longest request frame read from the host.
MAX_REQUEST = 64 * 1024
MAX_LIST = 10000
# A listing's header line stays under this many bytes (the host refuses a longer one): a
# directory whose entries would not fit is listed truncated.
MAX_LIST_BYTES = 2 * 1024 * 1024
MAX_MEMBERS = 100000
TMP_PREFIX = ".kernelbox-upload-"


class Refused(Exception):
    def __init__(self, code, message):
        Exception.__init__(self, message)
        self.code = code
        self.message = message


def write_all(data):
    view = memoryview(data)
    while view:
        view = view[os.write(OUT, view):]


# Set while a frame is partly written: an error then leaves stdout mid-frame, so the helper
# ends without a status (the host sees a stream cut short, never a misread frame).
MID_FRAME = [False]


def frame(kind, payload=b""):
    head = kind + len(payload).to_bytes(4, "big")
    MID_FRAME[0] = True
    if len(payload) < 65536:
        write_all(head + payload)
    else:
        sent = os.writev(OUT, [head, payload])
        if sent < len(head):
            write_all(head[sent:])
            sent = len(head)
        write_all(memoryview(payload)[sent - len(head):])
    MID_FRAME[0] = False


def status(obj):
    frame(b"S", json.dumps(obj).encode())


def read_exact(n):
    """n bytes of the channel; fewer only at EOF."""
    parts = []
    while n:
        data = os.read(IN, n)
        if not data:
            break
        parts.append(data)
        n -= len(data)
    return b"".join(parts)


def check_name(name):
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise Refused("invalid_path", "%r is not a plain file name" % name)


def open_nofollow(name, flags, dir_fd, mode=0o777):
    """os.open(name, flags | O_NOFOLLOW, dir_fd=dir_fd) that never opens a symlink's target:
    gVisor (runsc) follows a symlink opened with O_NOFOLLOW together with O_DIRECTORY or
    O_NONBLOCK, where Linux fails with ELOOP (docs/runtimes.md). The name's lstat is compared
    with the file opened; a symlink, or an entry swapped around the open, fails with ELOOP as
    Linux would."""
    fd = os.open(name, flags | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
    try:
        entry = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        opened = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if stat.S_ISLNK(entry.st_mode) or (entry.st_dev, entry.st_ino) != (
        opened.st_dev,
        opened.st_ino,
    ):
        os.close(fd)
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name)
    return fd


def open_at(base, parts, create=False, made=None):
    """The directory at `parts` under the directory fd `base` (not closed), as an fd; never
    follows a symlink; creates missing ones with `create`, appending to the list `made` the
    index in `parts` of each one it created."""
    fd = os.dup(base)
    try:
        for i, name in enumerate(parts):
            check_name(name)
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
            try:
                nfd = open_nofollow(name, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise Refused("not_found", "/".join(parts[: i + 1]) + " does not exist")
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                    if made is not None:
                        made.append(i)
                except FileExistsError:
                    pass
                nfd = open_nofollow(name, flags, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise Refused(
                        "not_a_directory",
                        "/".join(parts[: i + 1]) + " is a symlink or not a directory",
                    )
                raise
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_dir(parts, create=False, made=None):
    """The directory at `parts` under /work, as an fd; never follows a symlink (see open_at
    for `create` and `made`)."""
    base = os.open(WORK, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return open_at(base, parts, create, made)
    finally:
        os.close(base)


def unmake(parts, made):
    """After a failed upload: removes the directories of `parts` that open_dir created (their
    indexes in `made`), deepest first, while they are empty. Never follows a symlink (one a
    cell put in their place is left, as is anything a cell put in them)."""
    for i in reversed(made):
        try:
            fd = open_dir(parts[:i])
        except (Refused, OSError):
            return
        try:
            os.rmdir(parts[i], dir_fd=fd)
        except OSError:
            return
        finally:
            os.close(fd)


def kind_of(mode):
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class Frames:
    """The upload on the channel, as a file object; `complete` once the end frame arrived."""

    def __init__(self):
        self.left = 0
        self.complete = False
        self.acked = False

    def ack(self):
        """Tells the host to send the upload."""
        frame(b"A")
        self.acked = True

    def next_frame(self):
        """Reads the next frame's length; False at the end frame."""
        while self.left == 0:
            if self.complete:
                return False
            head = read_exact(4)
            if len(head) < 4:
                raise Refused("aborted", "the upload ended before its end")
            self.left = int.from_bytes(head, "big")
            if self.left == 0:
                self.complete = True
                return False
        return True

    def read(self, n=-1):
        if not self.next_frame():
            return b""
        want = self.left if n is None or n < 0 else min(n, self.left)
        data = os.read(IN, want)
        if not data:
            raise Refused("aborted", "the upload ended before its end")
        self.left -= len(data)
        return data

    def copy_to(self, fd):
        """Writes the whole upload to fd; returns its size. Moves the bytes to the file in the
        kernel with os.splice when it can (straight from a stdin pipe; from the socket through
        a pipe of its own), else reads and writes."""
        size = 0
        splice = getattr(os, "splice", None)
        pipe = None
        try:
            while self.next_frame():
                if splice is not None:
                    try:
                        if CHANNEL and pipe is None:
                            pipe = os.pipe()
                            widen(pipe[1])
                            # Drained without waiting: bytes missing from it (a cell reading
                            # the helper's pipe) abort the upload instead of hanging it.
                            os.set_blocking(pipe[0], False)
                        moved = splice(IN, pipe[1] if CHANNEL else fd, min(self.left, CHUNK))
                    except OSError as e:
                        if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                            raise
                        splice = None
                        continue
                    if CHANNEL and moved:
                        drain_pipe(pipe[0], fd, moved)
                    if not moved:
                        raise Refused("aborted", "the upload ended before its end")
                    self.left -= moved
                    size += moved
                    continue
                data = self.read(CHUNK)
                write_all_fd(fd, data)
                size += len(data)
        finally:
            if pipe is not None:
                os.close(pipe[0])
                os.close(pipe[1])
        return size

    def drain_to_end(self):
        while self.read(CHUNK):
            pass


def drain_pipe(rfd, fd, n):
    """Moves the n bytes waiting in the pipe rfd to fd: spliced, or read and written where
    the file does not take splice."""
    while n:
        try:
            moved = os.splice(rfd, fd, n, flags=os.SPLICE_F_NONBLOCK)
        except BlockingIOError:
            raise Refused("aborted", "the upload's pipe emptied")
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            try:
                data = os.read(rfd, n)
            except BlockingIOError:
                data = b""
            if not data:
                raise Refused("aborted", "the upload's pipe emptied")
            write_all_fd(fd, data)
            moved = len(data)
        if not moved:
            raise Refused("aborted", "the upload's pipe emptied")
        n -= moved


def write_all_fd(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def temp_name():
    return TMP_PREFIX + os.urandom(8).hex()


def copy_sparse(fd, src, extents, size):
    """Writes a sparse tar member's data extents at their offsets in fd and gives it its size:
    its holes stay holes. tarfile's file object would read each hole as zeros, written whole,
    so a restored sparse file (docs/snapshots.md, "Files-only snapshots") would fill the disk."""
    raw = getattr(src, "raw", src)
    for offset, length in extents:
        raw.seek(offset)
        os.lseek(fd, offset, os.SEEK_SET)
        while length > 0:
            data = raw.read(min(CHUNK, length))
            if not data:
                raise Refused("invalid_tar", "a sparse member ends before its data")
            write_all_fd(fd, data)
            length -= len(data)
    os.ftruncate(fd, size)
    return size


def write_file_at(dfd, name, src, sparse=None):
    """Writes `src` to a temp file in dfd, then renames it over `name`. Returns the size.
    `sparse`: a sparse tar member's `(extents, size)`, its holes kept as holes."""
    check_name(name)
    tmp = temp_name()
    fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, dir_fd=dfd, mode=0o644)
    done = False
    size = 0
    try:
        try:
            if isinstance(src, Frames):
                size = src.copy_to(fd)
            elif sparse is not None:
                size = copy_sparse(fd, src, *sparse)
            else:
                while True:
                    data = src.read(CHUNK)
                    if not data:
                        break
                    write_all_fd(fd, data)
                    size += len(data)
        finally:
            os.close(fd)
        try:
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except IsADirectoryError:
            raise Refused("is_a_directory", "%s is a directory" % name)
        except OSError as e:
            if e.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                raise Refused("is_a_directory", "%s is a directory" % name)
            raise
        done = True
        return size
    finally:
        if not done:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass


def op_write(parts, frames):
    if not parts:
        raise Refused("is_a_directory", "the working directory itself is a directory")
    made = []
    try:
        dfd = open_dir(parts[:-1], create=True, made=made)
    except BaseException:
        unmake(parts[:-1], made)
        raise
    try:
        frames.ack()
        size = write_file_at(dfd, parts[-1], frames)
    except BaseException:
        os.close(dfd)
        unmake(parts[:-1], made)
        raise
    os.close(dfd)
    return {"ok": True, "path": "/".join([WORK] + parts), "size": size}


def member_parts(name):
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or any(p == ".." for p in parts):
        raise Refused("tar_member_refused", "tar member %r escapes the directory" % name)
    for p in parts:
        check_name(p)
    return parts


def remove_tree_at(dfd, name):
    """Removes `name` in dfd, a directory tree included, never following a symlink."""
    try:
        sub = open_nofollow(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            os.unlink(name, dir_fd=dfd)
            return
        raise
    try:
        for entry in os.scandir(sub):
            remove_tree_at(sub, entry.name)
    finally:
        os.close(sub)
    os.rmdir(name, dir_fd=dfd)


def check_merge(src_fd, dst_fd, prefix=""):
    """Refuses, before anything moves, a merge that would fail part-way: a staged directory
    over an existing non-directory (or symlink), a staged file over an existing directory."""
    for entry in os.scandir(src_fd):
        name = entry.name
        try:
            st = os.stat(name, dir_fd=dst_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if entry.is_dir(follow_symlinks=False):
            if not stat.S_ISDIR(st.st_mode):
                raise Refused("not_a_directory", "%s exists and is not a directory" % (prefix + name))
            sub_src = open_nofollow(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=src_fd)
            try:
                sub_dst = open_nofollow(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dst_fd)
                try:
                    check_merge(sub_src, sub_dst, prefix + name + "/")
                finally:
                    os.close(sub_dst)
            finally:
                os.close(sub_src)
        elif stat.S_ISDIR(st.st_mode):
            raise Refused("is_a_directory", "%s is a directory" % (prefix + name))


def merge_into(src_fd, dst_fd):
    """Moves every entry of src_fd into dst_fd: directories merge, files replace."""
    for entry in os.scandir(src_fd):
        name = entry.name
        if entry.is_dir(follow_symlinks=False):
            try:
                sub_dst = open_nofollow(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dst_fd)
            except FileNotFoundError:
                os.rename(name, name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
                continue
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Refused("not_a_directory", "%s exists and is not a directory" % name)
                raise
            sub_src = open_nofollow(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=src_fd)
            try:
                merge_into(sub_src, sub_dst)
            finally:
                os.close(sub_src)
                os.close(sub_dst)
        else:
            try:
                os.replace(name, name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            except OSError as e:
                if e.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                    raise Refused("is_a_directory", "%s is a directory" % name)
                raise


def staged_dir(sfd, names, member):
    """The staged directory at names (created), refusing a member whose parent an earlier
    member made a file."""
    try:
        return open_at(sfd, names, create=True)
    except Refused:
        raise Refused("tar_member_refused", "tar member %r is under a file of the archive" % member)
    except OSError as e:
        if e.errno in (errno.ENOTDIR, errno.ELOOP, errno.EEXIST):
            raise Refused("tar_member_refused", "tar member %r is under a file of the archive" % member)
        raise


def op_untar(parts, frames):
    """Extracts a tar (regular files and directories only) into the directory at parts.

    Everything goes into a fresh staging directory first, which is merged into place only
    once the whole archive was read and checked; on any failure the staging directory goes.
    """
    import tarfile

    made = []
    try:
        dfd = open_dir(parts, create=True, made=made)
    except BaseException:
        unmake(parts, made)
        raise
    stage = temp_name()
    try:
        os.mkdir(stage, 0o700, dir_fd=dfd)
    except BaseException:
        os.close(dfd)
        unmake(parts, made)
        raise
    files = 0
    total = 0
    merged = False
    try:
        frames.ack()
        sfd = open_nofollow(stage, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
        try:
            with tarfile.open(fileobj=frames, mode="r|") as archive:
                for count, member in enumerate(archive):
                    if count >= MAX_MEMBERS:
                        raise Refused("tar_member_refused", "more than %d members" % MAX_MEMBERS)
                    names = member_parts(member.name)
                    if not names:
                        continue
                    if member.isdir():
                        os.close(staged_dir(sfd, names, member.name))
                    elif member.isreg():
                        pfd = staged_dir(sfd, names[:-1], member.name)
                        try:
                            src = archive.extractfile(member)
                            sparse = (member.sparse, member.size) if member.sparse else None
                            total += write_file_at(pfd, names[-1], src, sparse)
                            mode = 0o755 if member.mode & 0o100 else 0o644
                            os.chmod(names[-1], mode, dir_fd=pfd)
                            os.utime(names[-1], (member.mtime, member.mtime), dir_fd=pfd)
                        finally:
                            os.close(pfd)
                        files += 1
                    else:
                        raise Refused(
                            "tar_member_refused",
                            "tar member %r is not a regular file or directory "
                            "(links and devices are refused)" % member.name,
                        )
            frames.drain_to_end()
            if not frames.complete:
                raise Refused("aborted", "the upload ended before its end")
            check_merge(sfd, dfd)
            merge_into(sfd, dfd)
            merged = True
        finally:
            os.close(sfd)
    except tarfile.TarError as e:
        raise Refused("invalid_tar", "not a readable tar archive: %s" % e)
    finally:
        try:
            remove_tree_at(dfd, stage)
        except OSError:
            pass
        os.close(dfd)
        if not merged:
            unmake(parts, made)
    return {"ok": True, "path": "/".join([WORK] + parts), "size": total, "files": files}


def header(obj):
    frame(b"H", json.dumps(obj, ensure_ascii=False).encode())


class DataOut:
    """A write-only file object whose writes go out as D frames."""

    def write(self, data):
        if data:
            frame(b"D", bytes(data))
        return len(data)

    def flush(self):
        pass


def send_file(fd, size):
    """Sends `size` bytes of fd as D frames, with os.sendfile (no copy through Python) when
    it can. A file that shrinks is padded to what was announced and refused."""
    offset = 0
    use_sendfile = hasattr(os, "sendfile")
    while offset < size:
        end = offset + min(CHUNK, size - offset)
        MID_FRAME[0] = True
        write_all(b"D" + (end - offset).to_bytes(4, "big"))
        while offset < end:
            sent = 0
            if use_sendfile:
                try:
                    sent = os.sendfile(OUT, fd, offset, end - offset)
                except OSError as e:
                    if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                        raise
                    use_sendfile = False
                    continue
            else:
                data = os.pread(fd, end - offset, offset)
                write_all(data)
                sent = len(data)
            if not sent:
                write_all(bytes(end - offset))
                MID_FRAME[0] = False
                raise Refused("changed", "the file shrank while it was read")
            offset += sent
        MID_FRAME[0] = False


def shown_name(name):
    # A name that is not UTF-8 is shown with U+FFFD for each undecodable byte (JSON cannot
    # carry the raw bytes).
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def listing(fd):
    entries = []
    truncated = False
    used = 64
    for entry in os.scandir(fd):
        if entry.name.startswith(TMP_PREFIX):
            continue
        if len(entries) >= MAX_LIST:
            truncated = True
            break
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        shown = {
            "name": shown_name(entry.name),
            "kind": kind_of(st.st_mode),
            "size": st.st_size,
            "modified": iso(st.st_mtime),
        }
        used += len(json.dumps(shown, ensure_ascii=False).encode()) + 2
        if used > MAX_LIST_BYTES:
            truncated = True
            break
        entries.append(shown)
    entries.sort(key=lambda e: e["name"])
    return entries, truncated


def disk_bytes(fd):
    """The size of the file system holding fd, bytes: no file on it holds more data."""
    try:
        st = os.fstatvfs(fd)
        return st.f_blocks * st.f_frsize
    except OSError:
        return 0


def data_map(fd, size):
    """The (offset, length) extents of fd that hold data (SEEK_DATA/SEEK_HOLE); None when the
    file system cannot say."""
    extents = []
    offset = 0
    try:
        while offset < size:
            try:
                start = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:
                    break
                raise
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
            if end <= start:
                break
            extents.append((start, end - start))
            offset = end
    except (OSError, AttributeError):
        return None
    if not extents or sum(extents[-1]) < size:
        # A file that ends in a hole says its end with an empty extent (as GNU tar does).
        extents.append((size, 0))
    return extents


class SparseBody:
    """A sparse member's data in the PAX 1.0 sparse format (what GNU tar and Python's tarfile
    read): the map as decimal lines padded to a block, then only the extents that hold data.
    A file that shrinks while read is padded with zeros (the member stays well formed)."""

    def __init__(self, fd, extents):
        lines = [str(len(extents))]
        for offset, length in extents:
            lines += [str(offset), str(length)]
        head = ("\n".join(lines) + "\n").encode()
        self.head = head + bytes(-len(head) % 512)
        self.fd = fd
        self.extents = list(extents)
        self.size = len(self.head) + sum(length for _, length in extents)

    def read(self, n):
        # Exactly n bytes until the end (tarfile's copy takes a short read for an end).
        out = []
        if self.head:
            out.append(self.head[:n])
            self.head = self.head[n:]
            n -= len(out[0])
        while n and self.extents:
            offset, length = self.extents[0]
            if length == 0:
                self.extents.pop(0)
                continue
            want = min(n, length, CHUNK)
            data = os.pread(self.fd, want, offset) or bytes(want)
            self.extents[0] = (offset + len(data), length - len(data))
            out.append(data)
            n -= len(data)
        return b"".join(out)


class Budget:
    """The data a tar may carry: what the file system under /work can hold. Sparse files and
    hard links are written as such, so a tar of a workspace never needs more; one that would
    is refused (docs/reliability.md, "Files")."""

    def __init__(self, limit):
        self.limit = limit
        self.used = 0

    def take(self, n, path):
        self.used += n
        if self.limit and self.used > self.limit:
            raise Refused(
                "larger_than_disk",
                "the tar would carry more than the %d bytes the file system holds (at %s)"
                % (self.limit, path),
            )


def add_tree(archive, dfd, prefix, budget, links):
    import tarfile

    for entry in sorted(os.scandir(dfd), key=lambda e: e.name):
        name = entry.name
        if name.startswith(TMP_PREFIX):
            continue
        path = prefix + name
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            continue
        info = tarfile.TarInfo(path)
        info.mtime = int(st.st_mtime)
        info.mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = open_nofollow(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
            except OSError:
                continue
            try:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
                add_tree(archive, sub, path + "/", budget, links)
            finally:
                os.close(sub)
        elif stat.S_ISLNK(st.st_mode):
            info.type = tarfile.SYMTYPE
            info.linkname = os.readlink(name, dir_fd=dfd)
            archive.addfile(info)
        elif stat.S_ISREG(st.st_mode):
            try:
                fd = open_nofollow(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as f:
                fst = os.fstat(f.fileno())
                if not stat.S_ISREG(fst.st_mode):
                    continue
                key = (fst.st_dev, fst.st_ino)
                if fst.st_nlink > 1 and key in links:
                    # Another name of a file already in the archive: a hard link to it.
                    info.type = tarfile.LNKTYPE
                    info.linkname = links[key]
                    archive.addfile(info)
                    continue
                if fst.st_nlink > 1:
                    links[key] = path
                extents = None
                if fst.st_blocks * 512 < fst.st_size:
                    extents = data_map(f.fileno(), fst.st_size)
                if extents is not None and sum(n for _, n in extents) < fst.st_size:
                    # Holes the file system told apart: only the data goes (a file whose holes
                    # cannot be told goes whole, within the budget).
                    body = SparseBody(f.fileno(), extents)
                    budget.take(body.size, path)
                    info.name = "GNUSparseFile.0/" + path
                    info.size = body.size
                    info.pax_headers = {
                        "GNU.sparse.major": "1",
                        "GNU.sparse.minor": "0",
                        "GNU.sparse.name": path,
                        "GNU.sparse.realsize": str(fst.st_size),
                    }
                    archive.addfile(info, body)
                    continue
                budget.take(fst.st_size, path)
                info.size = fst.st_size
                archive.addfile(info, f)


def op_read(parts, as_tar):
    if parts:
        pfd = open_dir(parts[:-1])
        try:
            try:
                fd = open_nofollow(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=pfd)
            except FileNotFoundError:
                raise Refused("not_found", "/".join(parts) + " does not exist")
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise Refused("symlink", "/".join(parts) + " is a symlink; it is not followed")
                if e.errno in (errno.ENXIO, errno.ENODEV, errno.EOPNOTSUPP):
                    # A socket, or a device with nothing behind it.
                    raise Refused("not_a_file", "/".join(parts) + " is not a regular file")
                raise
        finally:
            os.close(pfd)
    else:
        fd = os.open(WORK, os.O_RDONLY | os.O_DIRECTORY)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            if as_tar:
                import tarfile

                header({"kind": "tar"})
                with tarfile.open(
                    fileobj=DataOut(), mode="w|", format=tarfile.PAX_FORMAT, bufsize=CHUNK
                ) as archive:
                    add_tree(archive, fd, "", Budget(disk_bytes(fd)), {})
                return {"ok": True}
            entries, truncated = listing(fd)
            header({"kind": "dir", "entries": entries, "truncated": truncated})
            return {"ok": True}
        if not stat.S_ISREG(st.st_mode):
            raise Refused("not_a_file", "/".join(parts) + " is not a regular file")
        size = st.st_size
        limit = disk_bytes(fd)
        if limit and size > limit:
            # Only a sparse file is larger than its file system: its holes would stream as
            # zeros without end (docs/reliability.md, "Files").
            raise Refused(
                "larger_than_disk",
                "%s is %d bytes, more than its file system holds (%d bytes): a sparse file; "
                "download its directory as a tar" % ("/".join(parts), size, limit),
            )
        header({"kind": "file", "size": size})
        send_file(fd, size)
        return {"ok": True, "size": size}
    finally:
        os.close(fd)


def entry_of(name, st):
    return {
        "name": shown_name(name),
        "kind": kind_of(st.st_mode),
        "size": st.st_size,
        "modified": iso(st.st_mtime),
    }


def lstat_in(pfd, parts):
    try:
        return os.stat(parts[-1], dir_fd=pfd, follow_symlinks=False)
    except FileNotFoundError:
        raise Refused("not_found", "/".join(parts) + " does not exist")


def op_stat(parts):
    if not parts:
        return {"ok": True, "entry": entry_of("", os.stat(WORK))}
    pfd = open_dir(parts[:-1])
    try:
        st = lstat_in(pfd, parts)
    finally:
        os.close(pfd)
    return {"ok": True, "entry": entry_of(parts[-1], st)}


def op_mkdir(parts):
    if not parts:
        return {"ok": True, "created": False}
    pfd = open_dir(parts[:-1], create=True)
    try:
        try:
            os.mkdir(parts[-1], 0o755, dir_fd=pfd)
            created = True
        except FileExistsError:
            if not stat.S_ISDIR(lstat_in(pfd, parts).st_mode):
                raise Refused("not_a_directory", "/".join(parts) + " exists and is not a directory")
            created = False
    finally:
        os.close(pfd)
    return {"ok": True, "created": created}


def op_move(parts, to):
    if not isinstance(to, list) or not all(isinstance(p, str) for p in to):
        raise Refused("invalid_path", "the destination must be a list of names")
    for p in to:
        check_name(p)
    if not parts or not to:
        raise Refused("invalid_path", "the working directory itself cannot be moved")
    sfd = open_dir(parts[:-1])
    try:
        lstat_in(sfd, parts)
        dfd = open_dir(to[:-1], create=True)
        try:
            os.rename(parts[-1], to[-1], src_dir_fd=sfd, dst_dir_fd=dfd)
        except OSError as e:
            if e.errno in (errno.EINVAL, errno.ENOTEMPTY, errno.EEXIST, errno.EISDIR, errno.ENOTDIR):
                raise Refused("invalid_path", "%s cannot be moved to %s: %s"
                              % ("/".join(parts), "/".join(to), os.strerror(e.errno)))
            raise
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)
    return {"ok": True}


def op_remove(parts):
    if not parts:
        raise Refused("invalid_path", "the working directory itself cannot be removed")
    pfd = open_dir(parts[:-1])
    try:
        check_name(parts[-1])
        try:
            os.lstat(parts[-1], dir_fd=pfd)
        except FileNotFoundError:
            raise Refused("not_found", "/".join(parts) + " does not exist")
        remove_tree_at(pfd, parts[-1])
    finally:
        os.close(pfd)
    return {"ok": True}


OPS = {
    "write": lambda parts, frames, req: op_write(parts, frames),
    "untar": lambda parts, frames, req: op_untar(parts, frames),
    "read": lambda parts, frames, req: op_read(parts, False),
    "tar": lambda parts, frames, req: op_read(parts, True),
    "remove": lambda parts, frames, req: op_remove(parts),
    "stat": lambda parts, frames, req: op_stat(parts),
    "mkdir": lambda parts, frames, req: op_mkdir(parts),
    "move": lambda parts, frames, req: op_move(parts, req.get("to")),
}


def request():
    """The next request (op, parts, the whole request); None at EOF between requests."""
    head = read_exact(4)
    if not head:
        return None
    n = int.from_bytes(head, "big") if len(head) == 4 else -1
    if n < 0 or n > MAX_REQUEST:
        raise Refused("invalid_request", "a request frame of %d bytes" % n)
    body = read_exact(n)
    if len(body) < n:
        raise Refused("invalid_request", "the request ended early")
    try:
        req = json.loads(body)
        op, parts = req["op"], req["path"]
    except (ValueError, TypeError, KeyError) as e:
        raise Refused("invalid_request", "unreadable request: %s" % e)
    if op not in OPS:
        raise Refused("invalid_request", "unknown operation %r" % (op,))
    if not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
        raise Refused("invalid_path", "the path must be a list of names")
    return op, parts, req


def serve_one():
    """Serves one request; True when the helper can take another."""
    frames = Frames()
    try:
        req = request()
        if req is None:
            return False
        op, parts, whole = req
        for p in parts:
            check_name(p)
        status(OPS[op](parts, frames, whole))
        return True
    except Refused as e:
        answer = {"ok": False, "code": e.code, "message": e.message}
        keep = e.code != "invalid_request"
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            answer = {"ok": False, "code": "no_space", "message": "the working directory is full"}
        else:
            answer = {"ok": False, "code": "io", "message": str(e)}
        keep = not isinstance(e, ConnectionError)
    except BaseException as e:
        answer = {"ok": False, "code": "internal", "message": "%s: %s" % (type(e).__name__, e)}
        keep = False
    if MID_FRAME[0]:
        return False
    # After an acknowledged upload stopped short, the channel is mid-upload: this helper is done.
    keep = keep and (frames.complete or not frames.acked)
    status(answer)
    return keep


def widen(fd):
    """Asks for a 1 MiB pipe buffer on fd (the default 64 KiB makes the two ends wake each
    other far more often); best effort."""
    try:
        import fcntl

        fcntl.fcntl(fd, 1031, CHUNK)  # F_SETPIPE_SZ
    except (ImportError, OSError):
        pass


def connect():
    """Makes the socket named on stdin's first line the channel, presenting the token after
    it; says `Y` on stdout when it is, `N` when it cannot be reached (stdin and stdout stay
    the channel)."""
    global IN, OUT
    line = b""
    while not line.endswith(b"\n"):
        data = os.read(0, 1)
        if not data or len(line) > 512:
            raise SystemExit("no channel line on stdin")
        line += data
    path, token = line.decode("ascii").split()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # Bounded: a queue others filled must not hold the helper (it falls back instead).
        sock.settimeout(CONNECT_TIMEOUT)
        sock.connect(path)
        sock.sendall(token.encode("ascii"))
        sock.settimeout(None)
    except OSError:
        sock.close()
        os.write(1, b"N")
        return
    CHANNEL.append(sock)
    IN = OUT = sock.fileno()
    os.write(1, b"Y")


def main():
    args = sys.argv[1:]
    if args not in (["serve"], ["serve", "--channel"]):
        raise SystemExit("usage: file_helper.py serve [--channel]")
    if args[1:]:
        connect()
    if not CHANNEL:
        widen(IN)
        widen(OUT)
    try:
        while serve_one():
            pass
    except ConnectionError:
        pass


main()
