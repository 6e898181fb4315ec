# kernelbox file helper: one file operation inside a kernel's container, run by the host with
# the engine's exec API as `python3 -I -S -c <this file> OP PATH_JSON` as the kernel's user, in
# the kernel's container (its namespaces, cgroup and limits). Standard library only.
#
# Every path is a JSON list of plain names relative to /work. It is walked one component at a
# time with os.open(name, O_NOFOLLOW | O_DIRECTORY, dir_fd=parent) from /work, so a symlink
# anywhere on the way (planted by a cell, to / or /proc/1/environ) is refused, never followed,
# and no name can climb out ("..", ".", "/" in a name are refused before any open). The
# final name is opened with O_NOFOLLOW too, and written only by rename over it (a rename
# replaces a symlink, it does not write through it).
#
# Protocol (README "Files in and out of a kernel"):
#   stdin   for `write` and `untar`: frames of a 4-byte big-endian length and that many bytes;
#           a zero-length frame ends the upload. EOF before it aborts: nothing is left.
#   stdout  for `read`: one JSON header line, then the data it announces.
#   stderr  one JSON status line at the end: {"ok": true, ...} or {"ok": false, "code", "message"}.
import errno
import json
import os
import stat
import sys
import tarfile
import time

WORK = "/work"
CHUNK = 1024 * 1024
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


def status(obj):
    sys.stderr.write(json.dumps(obj) + "\n")
    sys.stderr.flush()


def check_name(name):
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise Refused("invalid_path", "%r is not a plain file name" % name)


def open_dir(parts, create=False):
    """The directory at `parts` under /work, as an fd; never follows a symlink."""
    fd = os.open(WORK, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i, name in enumerate(parts):
            check_name(name)
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
            try:
                nfd = os.open(name, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise Refused("not_found", "/".join(parts[: i + 1]) + " does not exist")
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                nfd = os.open(name, flags, dir_fd=fd)
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
    """The upload on stdin, as a file object; `complete` once the end frame arrived."""

    def __init__(self):
        self.src = sys.stdin.buffer
        self.left = 0
        self.complete = False

    def read(self, n=-1):
        while self.left == 0:
            if self.complete:
                return b""
            head = self.src.read(4)
            if len(head) < 4:
                raise Refused("aborted", "the upload ended before its end")
            self.left = int.from_bytes(head, "big")
            if self.left == 0:
                self.complete = True
                return b""
        want = self.left if n is None or n < 0 else min(n, self.left)
        data = self.src.read(want)
        if not data:
            raise Refused("aborted", "the upload ended before its end")
        self.left -= len(data)
        return data

    def drain_to_end(self):
        while self.read(CHUNK):
            pass


def temp_name():
    return TMP_PREFIX + os.urandom(8).hex()


def write_file_at(dfd, name, src):
    """Writes `src` to a temp file in dfd, then renames it over `name`. Returns the size."""
    check_name(name)
    tmp = temp_name()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dfd)
    done = False
    size = 0
    try:
        with os.fdopen(fd, "wb", buffering=0) as out:
            while True:
                data = src.read(CHUNK)
                if not data:
                    break
                out.write(data)
                size += len(data)
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


def op_write(parts):
    if not parts:
        raise Refused("is_a_directory", "the working directory itself is a directory")
    frames = Frames()
    dfd = open_dir(parts[:-1], create=True)
    try:
        size = write_file_at(dfd, parts[-1], frames)
    finally:
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
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
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
            sub_src = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=src_fd)
            try:
                sub_dst = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dst_fd)
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
                sub_dst = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dst_fd)
            except FileNotFoundError:
                os.rename(name, name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
                continue
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Refused("not_a_directory", "%s exists and is not a directory" % name)
                raise
            sub_src = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=src_fd)
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


def op_untar(parts):
    """Extracts a tar (regular files and directories only) into the directory at parts.

    Everything goes into a fresh staging directory first, which is merged into place only
    once the whole archive was read and checked; on any failure the staging directory goes.
    """
    frames = Frames()
    dfd = open_dir(parts, create=True)
    stage = temp_name()
    os.mkdir(stage, 0o700, dir_fd=dfd)
    files = 0
    total = 0
    try:
        sfd = os.open(stage, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
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
                            total += write_file_at(pfd, names[-1], src)
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
    return {"ok": True, "path": "/".join([WORK] + parts), "size": total, "files": files}


def open_at(base, parts, create=False):
    """Like open_dir, from the directory fd `base` (not closed)."""
    fd = os.dup(base)
    try:
        for name in parts:
            check_name(name)
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
            try:
                nfd = os.open(name, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, 0o755, dir_fd=fd)
                nfd = os.open(name, flags, dir_fd=fd)
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def header(obj):
    out = sys.stdout.buffer
    out.write(json.dumps(obj, ensure_ascii=False).encode() + b"\n")
    out.flush()


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


def add_tree(archive, dfd, prefix):
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
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
            except OSError:
                continue
            try:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
                add_tree(archive, sub, path + "/")
            finally:
                os.close(sub)
        elif stat.S_ISLNK(st.st_mode):
            info.type = tarfile.SYMTYPE
            info.linkname = os.readlink(name, dir_fd=dfd)
            archive.addfile(info)
        elif stat.S_ISREG(st.st_mode):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as f:
                fst = os.fstat(f.fileno())
                if not stat.S_ISREG(fst.st_mode):
                    continue
                info.size = fst.st_size
                archive.addfile(info, f)


def op_read(parts, as_tar):
    if parts:
        pfd = open_dir(parts[:-1])
        try:
            try:
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=pfd)
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
                header({"kind": "tar"})
                out = sys.stdout.buffer
                with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as archive:
                    add_tree(archive, fd, "")
                out.flush()
                return {"ok": True}
            entries, truncated = listing(fd)
            header({"kind": "dir", "entries": entries, "truncated": truncated})
            return {"ok": True}
        if not stat.S_ISREG(st.st_mode):
            raise Refused("not_a_file", "/".join(parts) + " is not a regular file")
        size = st.st_size
        header({"kind": "file", "size": size})
        out = sys.stdout.buffer
        left = size
        while left > 0:
            data = os.read(fd, min(CHUNK, left))
            if not data:
                raise Refused("changed", "the file shrank while it was read")
            out.write(data)
            left -= len(data)
        out.flush()
        return {"ok": True, "size": size}
    finally:
        os.close(fd)


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


def main():
    op = sys.argv[1]
    parts = json.loads(sys.argv[2])
    if not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
        raise Refused("invalid_path", "the path must be a list of names")
    for p in parts:
        check_name(p)
    if op == "write":
        return op_write(parts)
    if op == "untar":
        return op_untar(parts)
    if op == "read":
        return op_read(parts, False)
    if op == "tar":
        return op_read(parts, True)
    if op == "remove":
        return op_remove(parts)
    raise Refused("invalid_request", "unknown operation %r" % op)


try:
    status(main())
except Refused as e:
    status({"ok": False, "code": e.code, "message": e.message})
except OSError as e:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        status({"ok": False, "code": "no_space", "message": "the working directory is full"})
    else:
        status({"ok": False, "code": "io", "message": str(e)})
except BaseException as e:
    status({"ok": False, "code": "internal", "message": "%s: %s" % (type(e).__name__, e)})
