"""runner/file_helper.py's path walk, on a temporary directory standing in for /work (no kernel,
no Docker): every path is walked one component at a time with O_NOFOLLOW from the working
directory, so a symlink on the way is refused, never followed; no name climbs out; a write
creates the directories on its way and, when it fails, removes those it created (deepest first,
while empty) without following a symlink put in their place (docs/files.md "Files in and out of a
kernel", docs/architecture.md "File transport").

The helper is standard library only and is sent to kernels as source; it is loaded here from
runner/ by path. Its last line calls main(), which refuses the test's argv with a usage
SystemExit once everything above it is defined.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator, List, Optional

import pytest

HELPER = Path(__file__).resolve().parents[2] / "runner" / "file_helper.py"


@pytest.fixture(scope="module")
def helper() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("kernelbox_file_helper", HELPER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    argv = sys.argv
    sys.argv = ["file_helper.py"]
    try:
        with pytest.raises(SystemExit, match="usage"):
            spec.loader.exec_module(module)
    finally:
        sys.argv = argv
    yield module


@pytest.fixture
def work(helper: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The helper's working directory; tmp_path/outside is beside it, out of its reach."""
    work = tmp_path / "work"
    work.mkdir()
    outside = tmp_path / "outside"
    (outside / "deeper").mkdir(parents=True)
    (outside / "secret.txt").write_bytes(b"secret")
    monkeypatch.setattr(helper, "WORK", str(work))
    return work


def outside_of(work: Path) -> Path:
    return work.parent / "outside"


def tree(root: Path) -> List[str]:
    """Everything under root, symlinks not followed, as sorted relative paths."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def refused(helper: ModuleType, code: str, call: Callable[[], object]) -> str:
    """Runs call, which must be refused with code; returns the message."""
    with pytest.raises(helper.Refused) as caught:
        call()
    assert caught.value.code == code, caught.value.message
    return str(caught.value.message)


class Upload:
    """What op_write takes the upload from (anything with ack() and read()): `data`, then the
    end; or, with `fail`, `data` then `fail()` run (a cell acting mid-upload) and the upload
    aborted, as the helper's own reader does when the host's end goes away."""

    def __init__(
        self, helper: ModuleType, data: bytes, fail: Optional[Callable[[], None]] = None
    ) -> None:
        self.refused = helper.Refused
        self.pieces = [data] if data else []
        self.fail = fail
        self.acked = False

    def ack(self) -> None:
        self.acked = True

    def read(self, n: int = -1) -> bytes:
        if self.pieces:
            return self.pieces.pop(0)
        if self.fail is not None:
            self.fail()
            raise self.refused("aborted", "the upload ended before its end")
        return b""


def same_dir(fd: int, path: Path) -> bool:
    st, want = os.fstat(fd), os.stat(path, follow_symlinks=False)
    return (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino)


# --- the walk ---------------------------------------------------------------------------------


def test_a_nested_path_is_walked_to_its_directory(helper: ModuleType, work: Path) -> None:
    (work / "a" / "b" / "c").mkdir(parents=True)
    for parts, path in (([], work), (["a"], work / "a"), (["a", "b", "c"], work / "a/b/c")):
        fd = helper.open_dir(parts)
        try:
            assert same_dir(fd, path), parts
        finally:
            os.close(fd)


@pytest.mark.parametrize("target", ["outside", "outside/secret.txt", "outside/missing", "/"])
@pytest.mark.parametrize("at", [[], ["a"]], ids=["at-top", "nested"])
def test_a_symlink_on_the_way_is_refused_not_followed(
    helper: ModuleType, work: Path, target: str, at: List[str]
) -> None:
    outside = outside_of(work)
    (work.joinpath(*at)).mkdir(parents=True, exist_ok=True)
    link = work.joinpath(*at, "link")
    link.symlink_to(target if target == "/" else work.parent / target)
    before = tree(outside)
    parts = at + ["link"]
    refused(helper, "not_a_directory", lambda: helper.open_dir(parts))
    refused(helper, "not_a_directory", lambda: helper.open_dir(parts + ["deeper"]))
    refused(helper, "not_a_directory", lambda: helper.open_dir(parts, create=True))
    if target != "/":
        # A write through it creates nothing on the other side, even where the target is
        # missing (a dangling link is not a missing name to create).
        upload = Upload(helper, b"planted")
        path = parts + ["deeper", "f"]
        refused(helper, "not_a_directory", lambda: helper.op_write(path, upload))
        refused(helper, "not_a_directory", lambda: helper.op_write(parts + ["f"], upload))
        assert not upload.acked
        assert tree(outside) == before
        assert (outside / "secret.txt").read_bytes() == b"secret"
    assert link.is_symlink()


def test_a_symlink_as_the_last_name_is_replaced_by_a_write_not_written_through(
    helper: ModuleType, work: Path
) -> None:
    secret = outside_of(work) / "secret.txt"
    (work / "f").symlink_to(secret)
    answer = helper.op_write(["f"], Upload(helper, b"new"))
    assert answer == {"ok": True, "path": str(work / "f"), "size": 3}
    assert not (work / "f").is_symlink() and (work / "f").read_bytes() == b"new"
    assert secret.read_bytes() == b"secret"


def test_a_symlink_is_removed_itself_never_its_target(helper: ModuleType, work: Path) -> None:
    outside = outside_of(work)
    (work / "d").mkdir()
    (work / "d" / "link").symlink_to(outside)
    before = tree(outside)
    assert helper.op_remove(["d", "link"]) == {"ok": True}
    assert tree(work) == ["d"]
    assert tree(outside) == before


# An absolute name is the outside directory's own path: were one ever opened, what the test
# writes would land in the temporary directory, never on the host.
ABSOLUTE = "<outside, absolute>"


@pytest.mark.parametrize("name", ["..", ".", "", ABSOLUTE, "a/b", "x\0y"])
def test_a_name_that_is_not_plain_is_refused_before_any_open(
    helper: ModuleType, work: Path, name: str
) -> None:
    outside = outside_of(work)
    if name == ABSOLUTE:
        name = str(outside)
    (work / "a" / "b").mkdir(parents=True)
    refused(helper, "invalid_path", lambda: helper.check_name(name))
    refused(helper, "invalid_path", lambda: helper.open_dir([name]))
    refused(helper, "invalid_path", lambda: helper.open_dir(["a", name]))
    upload = Upload(helper, b"x")
    refused(helper, "invalid_path", lambda: helper.op_write(["a", name, "f"], upload))
    refused(helper, "invalid_path", lambda: helper.op_write([name], upload))
    assert tree(work) == ["a", "a/b"]
    assert tree(work.parent) == ["outside", "outside/deeper", "outside/secret.txt"] + [
        "work", "work/a", "work/a/b"
    ]


@pytest.mark.parametrize("member", ["../x", "a/../../x", "/etc/passwd", "a/..", "a/b\0c"])
def test_a_tar_member_that_climbs_out_is_refused(helper: ModuleType, member: str) -> None:
    with pytest.raises(helper.Refused) as caught:
        helper.member_parts(member)
    assert caught.value.code in ("tar_member_refused", "invalid_path")


def test_a_tar_members_plain_name_is_its_components(helper: ModuleType) -> None:
    assert helper.member_parts("./a//b/") == ["a", "b"]
    assert helper.member_parts(".") == []


def test_a_missing_component_is_not_found_and_nothing_is_created(
    helper: ModuleType, work: Path
) -> None:
    (work / "a").mkdir()
    (work / "a" / "file").write_bytes(b"")
    message = refused(helper, "not_found", lambda: helper.open_dir(["a", "missing", "c"]))
    assert message == "a/missing does not exist"
    refused(helper, "not_a_directory", lambda: helper.open_dir(["a", "file", "c"]))
    upload = Upload(helper, b"x")
    refused(helper, "not_a_directory", lambda: helper.op_write(["a", "file", "c"], upload))
    assert tree(work) == ["a", "a/file"]


# --- a write's directories --------------------------------------------------------------------


def test_a_write_creates_the_directories_on_its_way(helper: ModuleType, work: Path) -> None:
    (work / "keep").mkdir()
    upload = Upload(helper, b"hello")
    answer = helper.op_write(["keep", "new", "deeper", "f.txt"], upload)
    assert upload.acked
    assert answer == {"ok": True, "path": str(work / "keep/new/deeper/f.txt"), "size": 5}
    assert (work / "keep/new/deeper/f.txt").read_bytes() == b"hello"
    assert tree(work) == ["keep", "keep/new", "keep/new/deeper", "keep/new/deeper/f.txt"]


def test_a_failed_write_removes_the_directories_it_created_and_its_temporary_file(
    helper: ModuleType, work: Path
) -> None:
    (work / "keep").mkdir()
    seen: List[List[str]] = []
    upload = Upload(helper, b"half", fail=lambda: seen.append(tree(work)))
    refused(helper, "aborted", lambda: helper.op_write(["keep", "new", "deeper", "f"], upload))
    # Mid-upload the directories and the temporary file were there...
    assert seen[0][:3] == ["keep", "keep/new", "keep/new/deeper"]
    assert seen[0][3].startswith("keep/new/deeper/" + helper.TMP_PREFIX)
    # ...then all of it went but what was there before.
    assert tree(work) == ["keep"]


def test_a_failed_write_leaves_a_directory_it_created_that_a_cell_filled(
    helper: ModuleType, work: Path
) -> None:
    def cell() -> None:
        (work / "new" / "theirs.txt").write_bytes(b"")

    upload = Upload(helper, b"", cell)
    refused(helper, "aborted", lambda: helper.op_write(["new", "deeper", "f"], upload))
    # deeper (empty) went; new holds the cell's file, so it stays.
    assert tree(work) == ["new", "new/theirs.txt"]


def test_a_failed_write_never_removes_through_a_symlink_put_in_place_of_its_directory(
    helper: ModuleType, work: Path
) -> None:
    outside = outside_of(work)

    def cell() -> None:
        # The directory the write created swapped for a symlink to a tree of the same shape.
        (work / "new").rename(work / "moved")
        (work / "new").symlink_to(outside)

    before = tree(outside)
    upload = Upload(helper, b"", cell)
    refused(helper, "aborted", lambda: helper.op_write(["new", "deeper", "f"], upload))
    assert tree(outside) == before, "the empty outside/deeper must not be removed"
    assert (work / "new").is_symlink()
    # The temporary file went all the same (removed through the directory fd the write held).
    assert tree(work / "moved") == ["deeper"]


def test_a_sparse_tar_member_is_written_with_its_holes_kept(
    helper: ModuleType, work: Path, tmp_path: Path
) -> None:
    """A files-only snapshot keeps a sparse file as a PAX 1.0 sparse member (docs/snapshots.md,
    "Files-only snapshots"); its restore extracts it through the helper, which must write only
    its data: its holes read back as zeros, written whole, filled the restored kernel's working
    directory (a 50 GiB sparse file made every restore of its snapshot fail `no_space`)."""
    import subprocess
    import tarfile

    apparent = 256 * 1024 * 1024
    source = tmp_path / "src"
    source.mkdir()
    with open(source / "sparse", "wb") as f:
        f.seek(1024 * 1024)
        f.write(b"middle")
        f.truncate(apparent - 3)
        f.seek(apparent - 3)
        f.write(b"end")
    archive = tmp_path / "a.tar"
    subprocess.run(
        [
            "tar", "--sparse", "--sparse-version=1.0", "--format=pax",
            "-cf", str(archive), "-C", str(source), "sparse",
        ],
        check=True,
    )
    dfd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with open(archive, "rb") as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
            member = next(iter(tar))
            assert member.sparse, "GNU tar wrote no sparse map"
            size = helper.write_file_at(
                dfd, "sparse", tar.extractfile(member), (member.sparse, member.size)
            )
    finally:
        os.close(dfd)
    restored = work / "sparse"
    assert size == apparent
    assert restored.stat().st_size == apparent
    assert restored.stat().st_blocks * 512 < 4 * 1024 * 1024
    with open(restored, "rb") as f:
        f.seek(1024 * 1024)
        assert f.read(6) == b"middle"
        f.seek(apparent - 3)
        assert f.read() == b"end"
        f.seek(4096)
        assert f.read(4096) == bytes(4096)
