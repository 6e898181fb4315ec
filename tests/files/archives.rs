//! Tar archives: a directory uploaded and downloaded as one, merges, and archives refused
//! whole (escaping, linked, nested or conflicting members, not a tar at all).

use hyper::header::CONTENT_TYPE;
use hyper::StatusCode;

use crate::http::Session;
use crate::{output, server, tar_of, TOKEN};

#[tokio::test(flavor = "multi_thread")]
async fn a_tar_of_1000_files_extracts_in_one_request_and_downloads_as_a_tar() {
    let s = server("files-tar", |_| {}).await;
    let tar = Session::new(&s.api, TOKEN, "tar");
    let contents: Vec<(String, Vec<u8>)> = (0..1000)
        .map(|i| {
            (
                format!("d{}/f{i}.txt", i % 10),
                format!("file {i}\n").into_bytes(),
            )
        })
        .collect();
    let entries: Vec<(&str, &[u8])> = contents
        .iter()
        .map(|(n, d)| (n.as_str(), d.as_slice()))
        .collect();
    let reply = tar.put_tar("in", tar_of(&entries)).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    assert_eq!(reply.json()["files"], 1000);
    let result = tar
        .run("import os\nn = sum(len(f) for _, _, f in os.walk('in'))\nprint(n, open('in/d7/f517.txt').read().strip())")
        .await;
    assert_eq!(output(&result), "1000 file 517", "{result}");

    // A second archive merges into the same directory.
    let more = tar_of(&[("d0/extra.txt", b"extra")]);
    let reply = tar.put_tar("in", more).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());

    let back = tar.get_tar("in").await;
    assert_eq!(back.status, StatusCode::OK);
    assert_eq!(back.headers[CONTENT_TYPE], "application/x-tar");
    let mut archive = tar::Archive::new(&back.body[..]);
    let mut found = std::collections::BTreeMap::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.header().entry_type().is_file() {
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
            found.insert(entry.path().unwrap().to_string_lossy().to_string(), data);
        }
    }
    assert_eq!(found.len(), 1001);
    for (name, data) in &contents {
        assert_eq!(found.get(name), Some(data), "{name}");
    }
    assert_eq!(found["d0/extra.txt"], b"extra");

    // A refused member anywhere refuses the whole archive: nothing of it is left.
    for (bad, code) in [
        (escaping_tar("../escape.txt"), "tar_member_refused"),
        (escaping_tar("/escape.txt"), "tar_member_refused"),
        (symlink_tar(), "tar_member_refused"),
        // A member under a file an earlier member made.
        (
            tar_of(&[("f", b"file"), ("f/under.txt", b"x")]),
            "tar_member_refused",
        ),
        (
            b"this is not a tar archive at all, just some bytes .....".repeat(20),
            "invalid_tar",
        ),
    ] {
        let reply = tar.put_tar("bad", bad).await;
        assert_eq!(reply.error(StatusCode::BAD_REQUEST), code);
    }
    // Not even the destination directory the upload made.
    let result = tar
        .run("import os\nprint(os.path.exists('bad'), os.path.exists('escape.txt'), os.path.exists('/escape.txt'))")
        .await;
    assert_eq!(output(&result), "False False False", "{result}");
    s.finish().await;
}

/// A file `ok.txt`, then one named `name` (which the tar crate itself would refuse to write).
fn escaping_tar(name: &str) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(1);
    header.set_mode(0o644);
    header.set_cksum();
    builder
        .append_data(&mut header, "ok.txt", &b"1"[..])
        .unwrap();
    let mut header = tar::Header::new_gnu();
    header.set_size(1);
    header.set_mode(0o644);
    let raw = &mut header.as_gnu_mut().unwrap().name;
    raw[..name.len()].copy_from_slice(name.as_bytes());
    header.set_cksum();
    builder.append(&header, &b"2"[..]).unwrap();
    builder.into_inner().unwrap()
}

fn symlink_tar() -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Symlink);
    header.set_size(0);
    header.set_mode(0o777);
    builder
        .append_link(&mut header, "pw", "/etc/passwd")
        .unwrap();
    let mut header = tar::Header::new_gnu();
    header.set_size(1);
    header.set_mode(0o644);
    header.set_cksum();
    builder.append_data(&mut header, "pw2", &b"x"[..]).unwrap();
    builder.into_inner().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn sockets_nested_tar_members_and_conflicting_merges_are_refused_whole_and_files_slash_lists()
{
    let s = server("files-small-holes", |_| {}).await;
    let small = Session::new(&s.api, TOKEN, "small");
    let result = small
        .run(
            "import os, socket\nsk = socket.socket(socket.AF_UNIX)\nsk.bind('sock')\n\
             os.makedirs('dst/keep')\nopen('dst/x', 'w').write('file')\nprint('ok')",
        )
        .await;
    assert_eq!(output(&result), "ok", "{result}");
    // A socket is not a file to read.
    let reply = small.get("sock").await;
    assert_eq!(reply.error(StatusCode::BAD_REQUEST), "not_a_file");
    // A member under a file of the same archive refuses the archive.
    let tar = tar_of(&[("a", b"file"), ("a/b", b"under")]);
    let reply = small.put_tar("t", tar).await;
    assert_eq!(reply.error(StatusCode::BAD_REQUEST), "tar_member_refused");
    // A conflict with what is there refuses the whole archive before anything moves: the
    // other members (`fNN` on either side of it, `keep/new`) are not merged either, in
    // whatever order the directory lists them.
    let names: Vec<String> = (0..40).map(|i| format!("f{i:02}")).collect();
    let mut members: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), &b"f"[..])).collect();
    members.insert(20, ("x/under", b"a file where dst/x is a file"));
    members.insert(10, ("keep/new", b"new"));
    let tar = tar_of(&members);
    let reply = small.put_tar("dst", tar).await;
    assert_eq!(reply.error(StatusCode::BAD_REQUEST), "not_a_directory");
    let listing = small.get("dst/").await.json();
    let names: Vec<&str> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["keep", "x"], "{listing}");
    let keep = small.get("dst/keep").await.json();
    assert_eq!(keep["entries"], serde_json::json!([]), "{keep}");
    // `.../files/` is the working directory, as `.../files` is.
    let reply = small.get("?child").await;
    assert_ne!(reply.status, StatusCode::NOT_FOUND);
    let reply = small.get("").await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert!(reply.json()["entries"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "dst"));
    s.finish().await;
}
