//! Files in and out of a session's kernel (README "Files in and out of a kernel"), end to end:
//! the real server over real HTTP, real kernels on the real engine, the helper inside them.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use bytes::Bytes;
use common::{memory_of, MIB};
use http::{tenant, tenants, Api, Reply, TestServer};
use hyper::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, StatusCode};
use rand::RngCore;
use serde_json::Value;
use sha2::{Digest, Sha256};

const TOKEN: &str = "tok-files";
const OTHER: &str = "tok-files-other";

async fn server(name: &str, tweak: impl FnOnce(&mut kernelbox::Config)) -> TestServer {
    TestServer::start(
        name,
        tenants(vec![tenant("files", TOKEN), tenant("others", OTHER)]),
        tweak,
    )
    .await
}

fn files(session: &str, path: &str) -> String {
    format!("/v1/sessions/{session}/files/{path}")
}

async fn put(
    api: &Api,
    token: &str,
    path: &str,
    body: Vec<u8>,
    content_type: Option<&str>,
) -> Reply {
    let mut req = api.build(Method::PUT, path, Some(token), false, false);
    if let Some(ct) = content_type {
        req = req.header(CONTENT_TYPE, ct);
    }
    let req = req
        .body(http_body_util::Full::new(Bytes::from(body)))
        .unwrap();
    read(api.http.request(req).await.expect("PUT")).await
}

async fn get(api: &Api, token: &str, path: &str, accept: Option<&str>) -> Reply {
    let mut req = api.build(Method::GET, path, Some(token), false, false);
    if let Some(a) = accept {
        req = req.header(ACCEPT, a);
    }
    let req = req.body(http_body_util::Full::new(Bytes::new())).unwrap();
    read(api.http.request(req).await.expect("GET")).await
}

async fn read(response: hyper::Response<hyper::body::Incoming>) -> Reply {
    use http_body_util::BodyExt;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("response body").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut data = vec![0u8; n];
    rand::rng().fill_bytes(&mut data);
    data
}

fn output(result: &Value) -> String {
    result["output"]
        .as_str()
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_mib_of_random_bytes_upload_start_the_kernel_and_a_cell_hashes_them_equal() {
    let s = server("files-roundtrip", |_| {}).await;
    let data = random_bytes(10 * 1024 * 1024);
    let digest = hex::encode(Sha256::digest(&data));
    // No kernel yet: the upload starts one.
    assert!(s.api.kernels(TOKEN).await.is_empty());
    let reply = put(
        &s.api,
        TOKEN,
        &files("rt", "data/in/blob.bin"),
        data.clone(),
        None,
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    assert_eq!(reply.json()["path"], "/work/data/in/blob.bin");
    assert_eq!(reply.json()["size"], data.len());
    assert_eq!(s.api.kernels(TOKEN).await.len(), 1);

    let result = s
        .api
        .run(
            TOKEN,
            "rt",
            "import hashlib, os\nb = open('data/in/blob.bin', 'rb').read()\n\
             print(hashlib.sha256(b).hexdigest(), os.stat('data/in/blob.bin').st_uid, os.getuid())",
        )
        .await;
    let out = output(&result);
    let fields: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(fields[0], digest, "{result}");
    // Written as the kernel's user: cells can change it.
    assert_eq!(fields[1], fields[2], "{result}");
    assert_eq!(
        result["kernel"]["reused"], true,
        "the upload's kernel ran the cell"
    );

    let back = get(&s.api, TOKEN, &files("rt", "data/in/blob.bin"), None).await;
    assert_eq!(back.status, StatusCode::OK);
    assert_eq!(
        back.headers[CONTENT_LENGTH],
        data.len().to_string().as_str()
    );
    assert!(back.body[..] == data[..], "downloaded bytes differ");
    let metrics = s.api.metrics().await;
    for direction in ["upload", "download"] {
        let line = format!("kernelbox_file_bytes_total{{direction=\"{direction}\"}} ");
        let n: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{line} missing"));
        assert!(n >= data.len() as u64, "{direction}: {n}");
    }
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_a_cell_wrote_downloads_byte_for_byte_and_directories_list() {
    let s = server("files-cell-written", |_| {}).await;
    s.api
        .run(
            TOKEN,
            "cw",
            "import os\nos.makedirs('out/sub', exist_ok=True)\n\
             open('out/report.bin', 'wb').write(bytes(range(256)) * 4099)\n\
             open('out/empty', 'wb').close()\nos.symlink('/etc', 'out/link')",
        )
        .await;
    let expected: Vec<u8> = (0..=255u8).cycle().take(256 * 4099).collect();
    let back = get(&s.api, TOKEN, &files("cw", "out/report.bin"), None).await;
    assert_eq!(back.status, StatusCode::OK);
    assert!(back.body[..] == expected[..], "downloaded bytes differ");
    let empty = get(&s.api, TOKEN, &files("cw", "out/empty"), None).await;
    assert_eq!(empty.status, StatusCode::OK);
    assert!(empty.body.is_empty());

    let listing = get(&s.api, TOKEN, &files("cw", "out"), None).await;
    assert_eq!(listing.status, StatusCode::OK);
    let entries = listing.json()["entries"].as_array().unwrap().clone();
    let names: Vec<(&str, &str)> = entries
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        names,
        [
            ("empty", "file"),
            ("link", "symlink"),
            ("report.bin", "file"),
            ("sub", "dir")
        ]
    );
    assert_eq!(entries[2]["size"], 256 * 4099);
    assert!(entries[2]["modified"].as_str().unwrap().ends_with('Z'));
    // The working directory itself.
    let root = get(&s.api, TOKEN, "/v1/sessions/cw/files", None).await;
    assert_eq!(root.status, StatusCode::OK, "{}", root.json());
    assert!(root.json()["entries"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "out" && e["kind"] == "dir"));
    let missing = get(&s.api, TOKEN, &files("cw", "out/nope"), None).await;
    assert_eq!(missing.error(StatusCode::NOT_FOUND), "not_found");
    s.finish().await;
}

/// A PUT whose body is streamed (no `Content-Length`): `chunks` chunks of `size` bytes.
async fn put_streamed(api: &Api, token: &str, path: &str, chunks: usize, size: usize) -> Reply {
    use http_body_util::{BodyExt, StreamBody};
    use hyper::body::Frame;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::combinators::BoxBody<Bytes, std::io::Error>>();
    let chunk = Bytes::from(vec![b'z'; size]);
    let stream = futures::stream::iter(
        (0..chunks).map(move |_| Ok::<_, std::io::Error>(Frame::data(chunk.clone()))),
    );
    let req = api
        .build(Method::PUT, path, Some(token), false, false)
        .body(StreamBody::new(stream).boxed())
        .unwrap();
    match client.request(req).await {
        Ok(response) => read(response).await,
        Err(e) => panic!("PUT failed: {e:?}"),
    }
}

fn tar_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, data) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, name, *data).unwrap();
    }
    builder.into_inner().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tar_of_1000_files_extracts_in_one_request_and_downloads_as_a_tar() {
    let s = server("files-tar", |_| {}).await;
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
    let reply = put(
        &s.api,
        TOKEN,
        &files("tar", "in"),
        tar_of(&entries),
        Some("application/x-tar"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    assert_eq!(reply.json()["files"], 1000);
    let result = s
        .api
        .run(
            TOKEN,
            "tar",
            "import os\nn = sum(len(f) for _, _, f in os.walk('in'))\nprint(n, open('in/d7/f517.txt').read().strip())",
        )
        .await;
    assert_eq!(output(&result), "1000 file 517", "{result}");

    // A second archive merges into the same directory.
    let more = tar_of(&[("d0/extra.txt", b"extra")]);
    let reply = put(
        &s.api,
        TOKEN,
        &files("tar", "in"),
        more,
        Some("application/x-tar"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());

    let back = get(
        &s.api,
        TOKEN,
        &files("tar", "in"),
        Some("application/x-tar"),
    )
    .await;
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
        (
            b"this is not a tar archive at all, just some bytes .....".repeat(20),
            "invalid_tar",
        ),
    ] {
        let reply = put(
            &s.api,
            TOKEN,
            &files("tar", "bad"),
            bad,
            Some("application/x-tar"),
        )
        .await;
        assert_eq!(reply.error(StatusCode::BAD_REQUEST), code);
    }
    let result = s
        .api
        .run(
            TOKEN,
            "tar",
            "import os\nprint(sorted(os.listdir('bad')), os.path.exists('escape.txt'), os.path.exists('/escape.txt'))",
        )
        .await;
    assert_eq!(output(&result), "[] False False", "{result}");
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
async fn traversal_absolute_paths_and_planted_symlinks_are_refused_and_nothing_outside_is_touched()
{
    let s = server("files-escape", |_| {}).await;
    s.api
        .run(
            TOKEN,
            "esc",
            "import os\nos.symlink('/', 'root')\nos.symlink('/proc/1/environ', 'environ')\n\
             os.symlink('/tmp', 'tmpdir')\nos.makedirs('real')\nos.symlink('/tmp', 'real/deeper')\n\
             open('/tmp/secret', 'w').write('outside')",
        )
        .await;
    let refused = [
        // `..` (percent-encoded so no client normalises it away) and absolute paths.
        (Method::GET, "%2E%2E/%2E%2E/etc/passwd", "invalid_path"),
        (Method::GET, "real/%2E%2E/%2E%2E/tmp/secret", "invalid_path"),
        (Method::GET, "%2Fetc%2Fpasswd", "invalid_path"),
        (Method::PUT, "%2E%2E/x", "invalid_path"),
        (Method::PUT, "%2Ftmp%2Fx", "invalid_path"),
        // Planted symlinks, as the last component or on the way.
        (Method::GET, "environ", "symlink"),
        (Method::GET, "root/etc/passwd", "not_a_directory"),
        (Method::GET, "root", "symlink"),
        (Method::GET, "tmpdir/secret", "not_a_directory"),
        (Method::GET, "real/deeper/secret", "not_a_directory"),
        (Method::PUT, "tmpdir/planted", "not_a_directory"),
        (Method::PUT, "root/tmp/planted", "not_a_directory"),
        (Method::PUT, "real/deeper/planted", "not_a_directory"),
        (Method::DELETE, "tmpdir/secret", "not_a_directory"),
        (Method::DELETE, "%2E%2E", "invalid_path"),
    ];
    for (method, path, code) in refused {
        let url = files("esc", path);
        let reply = match method {
            Method::PUT => put(&s.api, TOKEN, &url, b"evil".to_vec(), None).await,
            Method::GET => get(&s.api, TOKEN, &url, None).await,
            _ => s.api.delete(&url, TOKEN).await,
        };
        assert_eq!(
            reply.error(StatusCode::BAD_REQUEST),
            code,
            "{method} {path}"
        );
    }
    // A tar into a directory reached through a symlink is refused the same way.
    let reply = put(
        &s.api,
        TOKEN,
        &files("esc", "tmpdir"),
        tar_of(&[("a", b"1")]),
        Some("application/x-tar"),
    )
    .await;
    assert_eq!(reply.error(StatusCode::BAD_REQUEST), "not_a_directory");
    // Writing over a symlink's name replaces the link; its target is untouched.
    let reply = put(
        &s.api,
        TOKEN,
        &files("esc", "environ"),
        b"mine".to_vec(),
        None,
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    let result = s
        .api
        .run(
            TOKEN,
            "esc",
            "import os\nprint(sorted(os.listdir('/tmp')), open('/tmp/secret').read(), \
             os.path.islink('environ'), open('environ').read(), os.path.islink('tmpdir'))",
        )
        .await;
    assert_eq!(
        output(&result),
        "['secret'] outside False mine True",
        "{result}"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upload_over_the_cap_is_413_and_leaves_no_file_behind() {
    let s = server("files-cap", |c| c.max_upload_bytes = 1024 * 1024).await;
    s.api.run(TOKEN, "cap", "x = 1").await;
    // Declared too large: refused before anything reaches the kernel.
    let reply = put(
        &s.api,
        TOKEN,
        &files("cap", "big.bin"),
        vec![1; 1024 * 1024 + 1],
        None,
    )
    .await;
    assert_eq!(reply.error(StatusCode::PAYLOAD_TOO_LARGE), "file_too_large");
    // Streamed without a length: cut at the cap, the partial file removed.
    let reply = put_streamed(&s.api, TOKEN, &files("cap", "d/big.bin"), 40, 64 * 1024).await;
    assert_eq!(reply.error(StatusCode::PAYLOAD_TOO_LARGE), "file_too_large");
    let reply = put_streamed(&s.api, TOKEN, &files("cap", "d/ok.bin"), 16, 64 * 1024).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    let result = s
        .api
        .run(TOKEN, "cap", "import os\nprint(sorted(os.listdir('.')), sorted(os.listdir('d')), os.path.getsize('d/ok.bin'))")
        .await;
    assert_eq!(
        output(&result),
        "['.kernelbox', 'd'] ['ok.bin'] 1048576",
        "{result}"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upload_into_a_full_work_dir_is_507_and_leaves_nothing() {
    let s = server("files-full", |c| {
        c.sandbox.work_bytes = Some(8 * 1024 * 1024)
    })
    .await;
    s.api
        .run(
            TOKEN,
            "full",
            "open('keep.bin', 'wb').write(b'k' * (4 * 1024 * 1024))",
        )
        .await;
    let reply = put(
        &s.api,
        TOKEN,
        &files("full", "big.bin"),
        vec![7; 6 * 1024 * 1024],
        None,
    )
    .await;
    assert_eq!(reply.error(StatusCode::INSUFFICIENT_STORAGE), "no_space");
    let reply = put(
        &s.api,
        TOKEN,
        &files("full", "t"),
        tar_of(&[("a.bin", &vec![1u8; 6 * 1024 * 1024])]),
        Some("application/x-tar"),
    )
    .await;
    assert_eq!(reply.error(StatusCode::INSUFFICIENT_STORAGE), "no_space");
    let result = s
        .api
        .run(TOKEN, "full", "import os\nprint(sorted(os.listdir('.')), os.listdir('t'), os.path.getsize('keep.bin'))")
        .await;
    assert_eq!(
        output(&result),
        "['.kernelbox', 'keep.bin', 't'] [] 4194304",
        "{result}"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn no_kernel_other_tenants_and_children_are_isolated() {
    let s = server("files-isolation", |_| {}).await;
    // A session that never ran, for every read verb: 404 no_kernel, and nothing is started.
    let reply = get(&s.api, TOKEN, &files("iso", "a.txt"), None).await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    let reply = get(&s.api, TOKEN, "/v1/sessions/iso/files", None).await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    let reply = s.api.delete(&files("iso", "a.txt"), TOKEN).await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    assert!(s.api.kernels(TOKEN).await.is_empty());

    let reply = put(
        &s.api,
        TOKEN,
        &files("iso", "a.txt"),
        b"mine".to_vec(),
        None,
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED);
    // Another tenant naming the same session reaches nothing of it.
    let reply = get(&s.api, OTHER, &files("iso", "a.txt"), None).await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    let reply = s.api.delete(&files("iso", "a.txt"), OTHER).await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    // Its upload starts its own kernel, and its file stays its own.
    let reply = put(
        &s.api,
        OTHER,
        &files("iso", "a.txt"),
        b"theirs".to_vec(),
        None,
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(s.tenant_containers("files").await.len(), 1);
    assert_eq!(s.tenant_containers("others").await.len(), 1);
    assert_eq!(
        &get(&s.api, TOKEN, &files("iso", "a.txt"), None).await.body[..],
        b"mine"
    );
    assert_eq!(
        &get(&s.api, OTHER, &files("iso", "a.txt"), None).await.body[..],
        b"theirs"
    );

    // A delegated child's kernel has files of its own.
    let child = format!("{}?child=helper", files("iso", "c.txt"));
    let reply = get(&s.api, TOKEN, &child, None).await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    let reply = put(&s.api, TOKEN, &child, b"child's".to_vec(), None).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    let seen = s
        .api
        .execute(
            TOKEN,
            "iso",
            serde_json::json!({"code": "print(open('c.txt').read())", "child": "helper"}),
        )
        .await
        .json();
    assert_eq!(output(&seen), "child's", "{seen}");
    let reply = get(&s.api, TOKEN, &files("iso", "c.txt"), None).await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "not_found");
    assert_eq!(&get(&s.api, TOKEN, &child, None).await.body[..], b"child's");
    let reply = get(
        &s.api,
        TOKEN,
        &format!("{}?child=bad::name", files("iso", "c.txt")),
        None,
    )
    .await;
    assert_eq!(reply.error(StatusCode::BAD_REQUEST), "invalid_name");

    // Files live and die with the kernel.
    assert_eq!(
        s.api.delete("/v1/sessions/iso", TOKEN).await.status,
        StatusCode::OK
    );
    let reply = get(&s.api, TOKEN, &files("iso", "a.txt"), None).await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn uploads_and_deletes_run_while_a_cell_runs_in_the_same_kernel() {
    let s = server("files-concurrent", |_| {}).await;
    s.api.run(TOKEN, "busy", "x = 1").await;
    let mut events = s
        .api
        .stream(
            TOKEN,
            "busy",
            serde_json::json!({"code": concat!(
                "import os, time\nprint('waiting', flush=True)\n",
                "deadline = time.time() + 60\n",
                "while time.time() < deadline and not all(os.path.exists('up%d.bin' % i) for i in range(4)):\n",
                "    time.sleep(0.05)\n",
                "print('saw', sum(os.path.getsize('up%d.bin' % i) for i in range(4)))",
            )}),
        )
        .await;
    events.until_output("waiting").await;
    let uploads = (0..4).map(|i| {
        let api = s.api.clone();
        async move {
            put(
                &api,
                TOKEN,
                &files("busy", &format!("up{i}.bin")),
                vec![i as u8; 1024 * 1024],
                None,
            )
            .await
        }
    });
    for reply in futures::future::join_all(uploads).await {
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    }
    let result = events.result().await;
    assert_eq!(result["status"], "success", "{result}");
    assert!(output(&result).ends_with("saw 4194304"), "{result}");

    // Delete: a file, then a whole tree; the symlink itself goes, never its target.
    s.api
        .run(TOKEN, "busy", "import os\nos.makedirs('tree/a/b')\nopen('tree/a/b/f', 'w').write('x')\nos.symlink('/tmp', 'tree/link')\nopen('/tmp/keep', 'w').write('k')")
        .await;
    let reply = s.api.delete(&files("busy", "up0.bin"), TOKEN).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    assert_eq!(reply.json()["deleted"], "/work/up0.bin");
    let reply = s.api.delete(&files("busy", "tree"), TOKEN).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    let reply = s.api.delete(&files("busy", "tree"), TOKEN).await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "not_found");
    let result = s
        .api
        .run(TOKEN, "busy", "import os\nprint(os.path.exists('up0.bin'), os.path.exists('tree'), open('/tmp/keep').read())")
        .await;
    assert_eq!(output(&result), "False False k", "{result}");
    s.finish().await;
}

/// A real `kernelbox serve` process on a free port with one tenant (`TOKEN`); returns it and
/// an API client aimed at it.
async fn serve_process(label: &str, extra: &[&str]) -> (tokio::process::Child, Api) {
    use tokio::io::AsyncBufReadExt;
    let state = tempfile::tempdir().unwrap();
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
        .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(state.path())
        .arg("--label")
        .arg(format!("{}={label}", common::CASE))
        .args(extra)
        .env("KERNELBOX_TOKEN", TOKEN)
        .env_remove("KERNELBOX_TENANTS")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn kernelbox serve");
    let mut lines = tokio::io::BufReader::new(server.stderr.take().unwrap()).lines();
    let addr = common::serving_addr(&mut lines).await;
    tokio::spawn(async move {
        let _state = state;
        while let Ok(Some(_)) = lines.next_line().await {}
    });
    (server, Api::new(addr))
}

/// Stops a `kernelbox serve` process with SIGTERM and waits for it.
async fn stop(mut server: tokio::process::Child) {
    let pid = server.id().unwrap();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let status = tokio::time::timeout(std::time::Duration::from_secs(60), server.wait())
        .await
        .expect("the server stops")
        .unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_mib_streams_in_and_out_without_growing_the_server() {
    use http_body_util::BodyExt;
    let label = common::unique("files-stream-memory");
    let engine = common::engine().await;
    let (server, api) = serve_process(&label, &[]).await;
    let pid = server.id().unwrap();
    // Warm up: the kernel, the helper path, the allocator's pools.
    let reply = put(
        &api,
        TOKEN,
        &files("mem", "warm.bin"),
        vec![1; 4 * 1024 * 1024],
        None,
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED);
    let _ = get(&api, TOKEN, &files("mem", "warm.bin"), None).await;
    let (rss_before, hwm_before) = memory_of(pid);

    let size = 100 * 1024 * 1024;
    let started = std::time::Instant::now();
    let reply = put_streamed(&api, TOKEN, &files("mem", "big.bin"), 100, 1024 * 1024).await;
    let upload = started.elapsed();
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    assert_eq!(reply.json()["size"], size);

    let started = std::time::Instant::now();
    let req = api
        .build(
            Method::GET,
            &files("mem", "big.bin"),
            Some(TOKEN),
            false,
            false,
        )
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let response = api.http.request(req).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut received = 0usize;
    let mut all_z = true;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            all_z &= data.iter().all(|b| *b == b'z');
            received += data.len();
        }
    }
    let download = started.elapsed();
    assert_eq!(received, size);
    assert!(all_z, "downloaded bytes differ");

    let (rss_after, hwm_after) = memory_of(pid);
    let growth = rss_after.saturating_sub(rss_before);
    let peak = hwm_after.saturating_sub(hwm_before);
    eprintln!(
        "100 MiB: upload {:.0} MiB/s, download {:.0} MiB/s; server VmRSS {:.1} -> {:.1} MiB, VmHWM +{:.1} MiB",
        100.0 / upload.as_secs_f64(),
        100.0 / download.as_secs_f64(),
        rss_before as f64 / MIB,
        rss_after as f64 / MIB,
        peak as f64 / MIB,
    );
    assert!(
        peak < 32 * 1024 * 1024,
        "the server's peak grew by {:.1} MiB",
        peak as f64 / MIB
    );
    assert!(
        growth < 32 * 1024 * 1024,
        "the server grew by {:.1} MiB",
        growth as f64 / MIB
    );
    stop(server).await;
    common::assert_clean(&engine, &label).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kernelbox_cp_copies_files_and_directories_both_ways() {
    let label = common::unique("files-cp");
    let engine = common::engine().await;
    let (server, api) = serve_process(&label, &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let data = random_bytes(3 * 1024 * 1024 + 17);
    std::fs::write(dir.path().join("data.bin"), &data).unwrap();
    std::fs::create_dir_all(dir.path().join("proj/sub")).unwrap();
    std::fs::write(dir.path().join("proj/main.py"), "print('main')\n").unwrap();
    std::fs::write(dir.path().join("proj/sub/x.txt"), "x").unwrap();
    let cp = |args: &[&str]| {
        let out = std::process::Command::new("sh")
            .args([
                "-c",
                "umask 022 && exec \"$0\" \"$@\"",
                env!("CARGO_BIN_EXE_kernelbox"),
            ])
            .arg("cp")
            .args(args)
            .args(["--url", &api.base, "--token", TOKEN])
            .current_dir(dir.path())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    assert_eq!(cp(&["data.bin", "cps:in/data.bin"]).0, Some(0));
    assert_eq!(cp(&["./proj", "cps:proj"]).0, Some(0));
    let result = api
        .run(TOKEN, "cps", "import hashlib, os\nprint(hashlib.sha256(open('in/data.bin','rb').read()).hexdigest(), sorted(os.listdir('proj')))")
        .await;
    assert_eq!(
        output(&result),
        format!("{} ['main.py', 'sub']", hex::encode(Sha256::digest(&data)))
    );
    api.run(TOKEN, "cps", "import os\nos.makedirs('out/deep')\nopen('out/deep/r.txt','w').write('result')\nos.symlink('/etc/passwd', 'out/pw')\n\
         os.chmod('out/deep', 0o777)\nos.chmod('out/deep/r.txt', 0o6777)").await;
    assert_eq!(cp(&["cps:in/data.bin", "back.bin"]).0, Some(0));
    assert!(std::fs::read(dir.path().join("back.bin")).unwrap() == data);
    assert_eq!(cp(&["cps:out", "got"]).0, Some(0));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("got/deep/r.txt")).unwrap(),
        "result"
    );
    // The kernel's modes are masked by the umask (022 here) and never setuid or
    // world-writable.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| {
        std::fs::metadata(dir.path().join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("got/deep"), 0o755);
    assert_eq!(mode("got/deep/r.txt"), 0o755);
    // A link a kernel put in the archive is never created on the host.
    assert!(std::fs::symlink_metadata(dir.path().join("got/pw")).is_err());
    // Errors say what went wrong, with a usage exit code.
    let (code, stderr) = cp(&["cps:missing.txt", "m.txt"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("does not exist"), "{stderr}");
    let (code, stderr) = cp(&["nobody:x", "x"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("no live kernel"), "{stderr}");
    assert!(!dir.path().join("m.txt").exists() && !dir.path().join("x").exists());
    stop(server).await;
    common::assert_clean(&engine, &label).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_uploads_before_the_cell_and_downloads_after_it() {
    let label = common::unique("files-exec");
    let engine = common::engine().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in.csv"), "a,b\n1,2\n3,4\n").unwrap();
    std::fs::create_dir_all(dir.path().join("lib")).unwrap();
    std::fs::write(
        dir.path().join("lib/helper.py"),
        "def double(x):\n    return 2 * x\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
        .args(["exec", "--session", "ex", "--label"])
        .arg(format!("{}={label}", common::CASE))
        .args(["--upload", "in.csv:data/in.csv", "--upload", "lib"])
        .args(["--download", "out/total.txt:total.txt", "--download", "out"])
        .arg(
            "import csv, os, sys\nsys.path.insert(0, 'lib')\nfrom helper import double\n\
             rows = list(csv.DictReader(open('data/in.csv')))\nos.makedirs('out/more')\n\
             open('out/total.txt', 'w').write(str(double(sum(int(r['b']) for r in rows))))\n\
             open('out/more/n.txt', 'w').write(str(len(rows)))\nprint('done')",
        )
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["output"], "done\n", "{result}");
    // The upload started the kernel the cell ran in.
    assert_eq!(result["kernel"]["reused"], true, "{result}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("total.txt")).unwrap(),
        "12"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out/total.txt")).unwrap(),
        "12"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out/more/n.txt")).unwrap(),
        "2"
    );
    common::assert_clean(&engine, &label).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transfer_holds_its_kernel_against_the_idle_reaper_and_touches_its_last_use() {
    use http_body_util::{BodyExt, StreamBody};
    use hyper::body::Frame;
    let idle = std::time::Duration::from_secs(2);
    let s = server("files-reaper", |c| c.kernel_idle_timeout = idle).await;
    s.api.run(TOKEN, "slow", "x = 'kept'").await;
    // An upload whose body the test paces: it is in flight for longer than the idle timeout.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::combinators::BoxBody<Bytes, std::io::Error>>();
    let body = StreamBody::new(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }));
    let req = s
        .api
        .build(
            Method::PUT,
            &files("slow", "slow.bin"),
            Some(TOKEN),
            false,
            false,
        )
        .body(body.boxed())
        .unwrap();
    let upload = tokio::spawn(async move { read(client.request(req).await.unwrap()).await });
    tx.send(Ok(Frame::data(Bytes::from_static(b"first;"))))
        .await
        .unwrap();
    // Let the idle timeout pass while the transfer is in flight, then make the registry reap
    // (every new attach reaps idle kernels first).
    tokio::time::sleep(idle + std::time::Duration::from_millis(500)).await;
    s.api.run(TOKEN, "bystander", "pass").await;
    let kernels = s.api.kernels(TOKEN).await;
    assert!(
        kernels.iter().any(|k| k["session"] == "slow"),
        "reaped mid-transfer: {kernels:?}"
    );
    tx.send(Ok(Frame::data(Bytes::from_static(b"last"))))
        .await
        .unwrap();
    drop(tx);
    let reply = upload.await.unwrap();
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    // The transfer touched the kernel's last use: it is not idle since before the upload.
    let kernels = s.api.kernels(TOKEN).await;
    let slow = kernels
        .iter()
        .find(|k| k["session"] == "slow")
        .expect("the kernel");
    assert!(slow["idle_seconds"].as_f64().unwrap() < 1.5, "{slow}");
    let result = s
        .api
        .run(TOKEN, "slow", "print(x, open('slow.bin').read())")
        .await;
    assert_eq!(output(&result), "kept first;last", "{result}");
    assert!(result["kernel"]["state_lost"].is_null(), "{result}");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn in_project_mode_files_land_in_the_bind_mounted_project_directory() {
    use std::os::unix::fs::PermissionsExt;
    let project = tempfile::tempdir().unwrap();
    std::fs::set_permissions(project.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(project.path().join("host.txt"), "from the host").unwrap();
    let dir = project.path().to_path_buf();
    let s = server("files-project", |c| {
        c.mode = kernelbox::WorkMode::Project(dir)
    })
    .await;
    let reply = put(
        &s.api,
        TOKEN,
        &files("proj", "sub/up.txt"),
        b"uploaded".to_vec(),
        None,
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    assert_eq!(reply.json()["path"], "/work/sub/up.txt");
    assert_eq!(
        std::fs::read_to_string(project.path().join("sub/up.txt")).unwrap(),
        "uploaded"
    );
    let back = get(&s.api, TOKEN, &files("proj", "host.txt"), None).await;
    assert_eq!(&back.body[..], b"from the host");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upload_whose_client_breaks_off_leaves_nothing_half_written() {
    use http_body_util::{BodyExt, StreamBody};
    use hyper::body::Frame;
    let s = server("files-broken", |_| {}).await;
    s.api
        .run(TOKEN, "brk", "open('keep.txt', 'w').write('old')")
        .await;
    for name in ["keep.txt", "new.bin"] {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::combinators::BoxBody<Bytes, std::io::Error>>();
        let body = StreamBody::new(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        }));
        let req = s
            .api
            .build(Method::PUT, &files("brk", name), Some(TOKEN), false, false)
            .body(body.boxed())
            .unwrap();
        let upload = tokio::spawn(async move { client.request(req).await });
        tx.send(Ok(Frame::data(Bytes::from(vec![b'n'; 256 * 1024]))))
            .await
            .unwrap();
        // The client's body fails mid-way: the connection is cut.
        tx.send(Err(std::io::Error::other("client gave up")))
            .await
            .unwrap();
        assert!(
            upload.await.unwrap().is_err(),
            "the request should fail on the client"
        );
    }
    // The server notices the cut on its own schedule (the helper sees its stdin end without
    // the commit frame): wait, bounded, until the transfers let go of the kernel.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while s.api.kernels(TOKEN).await[0]["attached"] != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the transfers never ended"
        );
        tokio::task::yield_now().await;
    }
    let check = "import os\nprint(sorted(os.listdir('.')), open('keep.txt').read())";
    assert_eq!(
        output(&s.api.run(TOKEN, "brk", check).await),
        "['.kernelbox', 'keep.txt'] old"
    );
    s.finish().await;
}

/// Opens a connection with a tiny receive buffer, asks for `path` and reads no more than the
/// first bytes of the answer.
async fn stalled_get(api: &Api, path: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let addr: std::net::SocketAddr = api.base.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    let head =
        format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {TOKEN}\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    // The response has begun (the kernel is held) once its first bytes arrive.
    let mut first = [0u8; 1024];
    let n = tokio::io::AsyncReadExt::read(&mut stream, &mut first)
        .await
        .unwrap();
    assert!(
        first[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&first[..n])
    );
    stream
}

#[tokio::test(flavor = "multi_thread")]
async fn a_download_the_client_stops_reading_is_cut_and_frees_its_kernel_for_others() {
    let label = common::unique("files-stalled-download");
    let engine = common::engine().await;
    let (server, api) = serve_process(
        &label,
        &[
            "--max-kernels",
            "1",
            "--send-timeout",
            "3s",
            "--drain-timeout",
            "120s",
        ],
    )
    .await;
    let reply = put(
        &api,
        TOKEN,
        &files("held", "big.bin"),
        vec![7; 20 * 1024 * 1024],
        None,
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    let stalled = stalled_get(&api, &files("held", "big.bin")).await;
    // While the download holds the only kernel, another session cannot get one.
    let started = std::time::Instant::now();
    let mut refused = false;
    let freed = loop {
        let reply = api
            .execute(TOKEN, "other", serde_json::json!({"code": "print(6*7)"}))
            .await;
        if reply.status == StatusCode::OK {
            break started.elapsed();
        }
        assert_eq!(
            reply.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{}",
            reply.json()
        );
        refused = true;
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "the stalled download still holds its kernel after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    };
    assert!(refused, "the stalled download never held its kernel");
    eprintln!("a stalled download released its kernel after {freed:?}");
    // A second stalled download cannot hold SIGTERM's drain (120 s here) either.
    let reply = put(
        &api,
        TOKEN,
        &files("other", "big.bin"),
        vec![7; 20 * 1024 * 1024],
        None,
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    let stalled_again = stalled_get(&api, &files("other", "big.bin")).await;
    let stopping = std::time::Instant::now();
    stop(server).await;
    let stopped = stopping.elapsed();
    assert!(
        stopped < std::time::Duration::from_secs(30),
        "SIGTERM waited {stopped:?} for a stalled download"
    );
    drop((stalled, stalled_again));
    common::assert_clean(&engine, &label).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_non_utf8_name_is_listed_with_replacement_characters_and_long_names_stay_in_bound() {
    let s = server("files-names", |_| {}).await;
    let result = s
        .api
        .run(
            TOKEN,
            "names",
            "import os\nos.makedirs('bad')\nopen(b'bad/\\xff\\xfe', 'w').close()\n\
             open('bad/ok', 'w').close()\nos.makedirs('long')\n\
             for i in range(10000):\n    open('long/%05d' % i + '\\x01' * 245, 'w').close()\n\
             print('made')",
        )
        .await;
    assert_eq!(output(&result), "made", "{result}");
    let reply = get(&s.api, TOKEN, &files("names", "bad"), None).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    let names: Vec<String> = reply.json()["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        vec!["ok".to_string(), "\u{FFFD}\u{FFFD}".to_string()]
    );
    // 10,000 names that JSON escapes six-fold would pass the header bound: the listing is
    // truncated within it instead of failing.
    let reply = get(&s.api, TOKEN, &files("names", "long"), None).await;
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "{}",
        reply.error(reply.status)
    );
    let listing = reply.json();
    assert_eq!(listing["truncated"], true);
    let shown = listing["entries"].as_array().unwrap().len();
    assert!(shown > 500 && shown < 10_000, "{shown} entries");
    eprintln!(
        "a 10,000-entry listing of escaped names: {shown} entries, {} bytes",
        reply.body.len()
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sockets_nested_tar_members_and_conflicting_merges_are_refused_whole_and_files_slash_lists()
{
    let s = server("files-small-holes", |_| {}).await;
    let result = s
        .api
        .run(
            TOKEN,
            "small",
            "import os, socket\nsk = socket.socket(socket.AF_UNIX)\nsk.bind('sock')\n\
             os.makedirs('dst/keep')\nopen('dst/x', 'w').write('file')\nprint('ok')",
        )
        .await;
    assert_eq!(output(&result), "ok", "{result}");
    // A socket is not a file to read.
    let reply = get(&s.api, TOKEN, &files("small", "sock"), None).await;
    assert_eq!(reply.error(StatusCode::BAD_REQUEST), "not_a_file");
    // A member under a file of the same archive refuses the archive.
    let tar = tar_of(&[("a", b"file"), ("a/b", b"under")]);
    let reply = put(
        &s.api,
        TOKEN,
        &files("small", "t"),
        tar,
        Some("application/x-tar"),
    )
    .await;
    assert_eq!(reply.error(StatusCode::BAD_REQUEST), "tar_member_refused");
    // A conflict with what is there refuses the whole archive before anything moves: the
    // other members (`fNN` on either side of it, `keep/new`) are not merged either, in
    // whatever order the directory lists them.
    let names: Vec<String> = (0..40).map(|i| format!("f{i:02}")).collect();
    let mut members: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), &b"f"[..])).collect();
    members.insert(20, ("x/under", b"a file where dst/x is a file"));
    members.insert(10, ("keep/new", b"new"));
    let tar = tar_of(&members);
    let reply = put(
        &s.api,
        TOKEN,
        &files("small", "dst"),
        tar,
        Some("application/x-tar"),
    )
    .await;
    assert_eq!(reply.error(StatusCode::BAD_REQUEST), "not_a_directory");
    let listing = get(&s.api, TOKEN, &files("small", "dst/"), None)
        .await
        .json();
    let names: Vec<&str> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["keep", "x"], "{listing}");
    let keep = get(&s.api, TOKEN, &files("small", "dst/keep"), None)
        .await
        .json();
    assert_eq!(keep["entries"], serde_json::json!([]), "{keep}");
    // `.../files/` is the working directory, as `.../files` is.
    let reply = get(&s.api, TOKEN, "/v1/sessions/small/files/?child", None).await;
    assert_ne!(reply.status, StatusCode::NOT_FOUND);
    let reply = get(&s.api, TOKEN, "/v1/sessions/small/files/", None).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert!(reply.json()["entries"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "dst"));
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upload_cut_by_deleting_its_session_answers_no_kernel() {
    use http_body_util::{BodyExt, StreamBody};
    use hyper::body::Frame;
    let s = server("files-cut-upload", |_| {}).await;
    let (tx, rx) = futures::channel::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
    let feeder = tokio::spawn(async move {
        use futures::SinkExt;
        let mut tx = tx;
        for _ in 0..600 {
            if tx
                .send(Ok(Frame::data(Bytes::from(vec![b'u'; 1024]))))
                .await
                .is_err()
            {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    });
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::combinators::BoxBody<Bytes, std::io::Error>>();
    let req = s
        .api
        .build(
            Method::PUT,
            &files("cut", "slow.bin"),
            Some(TOKEN),
            false,
            false,
        )
        .body(StreamBody::new(rx).boxed())
        .unwrap();
    let upload = tokio::spawn(async move { read(client.request(req).await.unwrap()).await });
    // Until the helper has its temporary file, the upload is not under way.
    let started = std::time::Instant::now();
    loop {
        let result = s
            .api
            .run(
                TOKEN,
                "cut",
                "import glob\nprint(len(glob.glob('.kernelbox-upload-*')))",
            )
            .await;
        if output(&result) == "1" {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "{result}"
        );
    }
    let reply = s.api.delete("/v1/sessions/cut", TOKEN).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    let reply = tokio::time::timeout(std::time::Duration::from_secs(60), upload)
        .await
        .expect("the upload answers")
        .unwrap();
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    feeder.abort();
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_download_read_slower_than_the_minimum_rate_is_cut_and_frees_its_kernel() {
    use tokio::io::AsyncReadExt;
    let s = server("files-slow-download", |c| {
        c.max_session_kernels = 1;
        c.download_min_rate = 1024 * 1024;
        c.download_rate_grace = std::time::Duration::from_secs(2);
    })
    .await;
    let reply = put(
        &s.api,
        TOKEN,
        &files("slow", "big.bin"),
        vec![7; 20 * 1024 * 1024],
        None,
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    let mut reader = stalled_get(&s.api, &files("slow", "big.bin")).await;
    // A reader that keeps reading, 4 KiB every 100 ms (40 KiB/s): never stalled long enough
    // for the send timeout, far below the minimum rate.
    let trickle = tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        let mut total = 0usize;
        for _ in 0..600 {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        total
    });
    let started = std::time::Instant::now();
    let mut refused = false;
    let freed = loop {
        let reply = s
            .api
            .execute(TOKEN, "other", serde_json::json!({"code": "print(6*7)"}))
            .await;
        if reply.status == StatusCode::OK {
            break started.elapsed();
        }
        assert_eq!(
            reply.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{}",
            reply.json()
        );
        refused = true;
        assert!(
            started.elapsed() < std::time::Duration::from_secs(25),
            "the slow download still holds its kernel after {:?}: {}",
            started.elapsed(),
            reply.json()
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    };
    assert!(refused, "the slow download never held its kernel");
    eprintln!("a download read at 40 KiB/s released its kernel after {freed:?}");
    trickle.abort();
    s.finish().await;
}
