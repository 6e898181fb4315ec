"""`session.files`: write, read, list and remove the files of a session's kernel (the file
API, docs/files.md)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from conftest import Server
from kernelbox_client import AsyncClient, BadRequest, Client, FileEntry, Listing, NotFound


def test_bytes_written_are_what_the_cell_reads_and_what_comes_back(
    client: Client, session_name: str
) -> None:
    s = client.session(session_name)
    data = os.urandom(3 * 1024 * 1024 + 7)
    w = s.files.write("data/in.bin", data)
    assert (w.path, w.size) == ("/work/data/in.bin", len(data))
    r = s.run("import hashlib\nprint(hashlib.sha256(open('data/in.bin','rb').read()).hexdigest())")
    assert r.output == hashlib.sha256(data).hexdigest() + "\n"
    assert s.files.read("data/in.bin") == data
    s.close()


def test_a_local_file_is_streamed_up_by_path_and_by_file_object(
    client: Client, session_name: str, tmp_path: Path
) -> None:
    local = tmp_path / "big.bin"
    local.write_bytes(os.urandom(5 * 1024 * 1024))
    s = client.session(session_name)
    assert s.files.write("by-path.bin", local).size == local.stat().st_size
    with open(local, "rb") as f:
        assert s.files.write("by-file.bin", f).size == local.stat().st_size
    assert s.files.write("text.txt", "héllo\n").size == len("héllo\n".encode())
    r = s.run("import os\nprint(os.path.getsize('by-path.bin'), os.path.getsize('by-file.bin'))")
    assert r.output == f"{local.stat().st_size} {local.stat().st_size}\n"
    assert s.files.read("by-file.bin") == local.read_bytes()
    s.close()


def test_a_file_a_cell_wrote_downloads_byte_for_byte(client: Client, session_name: str) -> None:
    s = client.session(session_name)
    r = s.run(
        "import os\nblob = os.urandom(1 << 20)\nopen('out.bin', 'wb').write(blob)\n"
        "print(blob.hex()[:64])"
    )
    got = s.files.read("out.bin")
    assert len(got) == 1 << 20 and got.hex()[:64] == r.output.strip()
    s.close()


def test_list_describes_entries_and_remove_deletes(client: Client, session_name: str) -> None:
    s = client.session(session_name)
    s.files.write("dir/a.txt", b"abc")
    s.files.write("dir/sub/b.txt", b"")
    root = s.files.list()
    assert isinstance(root, Listing) and "dir" in root.names
    listing = s.files.list("dir")
    by_name = {e.name: e for e in listing}
    assert set(by_name) == {"a.txt", "sub"} and len(listing) == 2
    assert isinstance(by_name["a.txt"], FileEntry)
    assert (by_name["a.txt"].kind, by_name["a.txt"].size) == ("file", 3)
    assert by_name["sub"].kind == "dir" and by_name["a.txt"].modified
    assert s.files.remove("dir/a.txt") == "/work/dir/a.txt"
    assert [e.name for e in s.files.list("dir")] == ["sub"]
    with pytest.raises(NotFound):
        s.files.read("dir/a.txt")
    s.close()


def test_paths_outside_the_working_directory_are_bad_requests(
    client: Client, session_name: str
) -> None:
    s = client.session(session_name)
    s.files.write("ok.txt", b"ok")
    for path in ("../etc/passwd", "/etc/passwd", "a/../../x", ".."):
        with pytest.raises(BadRequest):
            s.files.read(path)
        with pytest.raises(BadRequest):
            s.files.write(path, b"x")
    s.close()


def test_a_tar_goes_up_and_a_directory_comes_down_as_tar(client: Client, session_name: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(50):
            body = f"file {i}\n".encode()
            info = tarfile.TarInfo(f"f{i:02}.txt")
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    s = client.session(session_name)
    w = s.files.write("many", buf.getvalue(), tar=True)
    assert w.files == 50
    assert s.run("import os\nprint(len(os.listdir('many')))").output == "50\n"
    with tarfile.open(fileobj=io.BytesIO(s.files.read("many", tar=True))) as tar:
        names = {m.name.split("/")[-1] for m in tar.getmembers() if m.isfile()}
    assert names == {f"f{i:02}.txt" for i in range(50)}
    s.close()


def test_a_childs_files_are_its_own(client: Client, session_name: str) -> None:
    parent, child = client.session(session_name), client.session(session_name, child="c1")
    parent.files.write("who.txt", b"parent")
    child.files.write("who.txt", b"child")
    assert parent.files.read("who.txt") == b"parent"
    assert child.files.read("who.txt") == b"child"
    parent.close()


def test_another_tenants_files_are_not_found(server: Server, session_name: str) -> None:
    with (
        Client(server.url, server.token("main")) as main,
        Client(server.url, server.token("other")) as other,
    ):
        main.session(session_name).files.write("secret.txt", b"main's")
        with pytest.raises(NotFound):
            other.session(session_name).files.read("secret.txt")
        main.session(session_name).close()


def test_async_files_round_trip(server: Server, session_name: str, tmp_path: Path) -> None:
    local = tmp_path / "a.bin"
    local.write_bytes(os.urandom(300_000))

    async def main() -> None:
        async with AsyncClient(server.url, server.token()) as c:
            s = c.session(session_name)
            assert (await s.files.write("small.txt", b"x")).size == 1
            assert (await s.files.write("a.bin", local)).size == 300_000
            assert await s.files.read("a.bin") == local.read_bytes()
            assert await s.files.download("a.bin", tmp_path / "a.out") == 300_000
            assert (tmp_path / "a.out").read_bytes() == local.read_bytes()

            async def chunks():
                yield b"x" * 10
                yield b"y" * 10

            assert (await s.files.write("gen.bin", chunks())).size == 20
            names = {n for n in (await s.files.list()).names if not n.startswith(".")}
            assert names == {"a.bin", "gen.bin", "small.txt"}
            assert await s.files.remove("gen.bin") == "/work/gen.bin"
            await s.close()

    asyncio.run(main())


def test_download_streams_to_a_path_or_a_file_object(
    client: Client, session_name: str, tmp_path: Path
) -> None:
    s = client.session(session_name)
    r = s.run(
        "import hashlib, os\nblob = os.urandom(8 << 20)\nopen('big.bin', 'wb').write(blob)\n"
        "print(hashlib.sha256(blob).hexdigest())"
    )
    dest = tmp_path / "big.bin"
    assert s.files.download("big.bin", dest) == 8 << 20
    assert hashlib.sha256(dest.read_bytes()).hexdigest() + "\n" == r.output
    buf = io.BytesIO()
    assert s.files.download("big.bin", buf) == 8 << 20 and buf.getvalue() == dest.read_bytes()
    # A failed download leaves nothing at the destination, not even a partial file.
    missing = tmp_path / "missing.bin"
    with pytest.raises(NotFound):
        s.files.download("no-such-file", missing)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.bin"]
    s.close()
