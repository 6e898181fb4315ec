//! Files in and out of a session's kernel (README "Files in and out of a kernel"), end to end:
//! the real server over real HTTP, real kernels on the real engine, the helper inside them.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use std::time::Duration;

use bytes::Bytes;
use common::{memory_of, MIB};
use http::{files, tenant, tenants, Api, Reply, Served, Session, TestServer};
use http_body_util::BodyExt;
use hyper::body::Frame;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE};
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

/// Asks, every 250 ms, for a cell in another session of `TOKEN`'s tenant until one runs;
/// asserts it was refused (429) at least once, as `holder` holds the only kernel, and that it
/// runs within `limit`. Returns how long that took.
async fn until_another_session_runs(api: &Api, holder: &str, limit: Duration) -> Duration {
    let started = std::time::Instant::now();
    let mut refused = false;
    loop {
        let reply = api
            .execute(TOKEN, "other", serde_json::json!({"code": "print(6*7)"}))
            .await;
        if reply.status == StatusCode::OK {
            assert!(refused, "{holder} never held its kernel");
            return started.elapsed();
        }
        assert_eq!(
            reply.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{}",
            reply.json()
        );
        refused = true;
        assert!(
            started.elapsed() < limit,
            "{holder} still holds its kernel after {:?}: {}",
            started.elapsed(),
            reply.json()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
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
    let rt = Session::new(&s.api, TOKEN, "rt");
    let data = random_bytes(10 * 1024 * 1024);
    let digest = hex::encode(Sha256::digest(&data));
    // No kernel yet: the upload starts one.
    assert!(s.api.kernels(TOKEN).await.is_empty());
    let reply = rt.put("data/in/blob.bin", data.clone()).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    assert_eq!(reply.json()["path"], "/work/data/in/blob.bin");
    assert_eq!(reply.json()["size"], data.len());
    assert_eq!(s.api.kernels(TOKEN).await.len(), 1);

    let result = rt
        .run(
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

    let back = rt.get("data/in/blob.bin").await;
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
    let cw = Session::new(&s.api, TOKEN, "cw");
    cw.run(
        "import os\nos.makedirs('out/sub', exist_ok=True)\n\
         open('out/report.bin', 'wb').write(bytes(range(256)) * 4099)\n\
         open('out/empty', 'wb').close()\nos.symlink('/etc', 'out/link')",
    )
    .await;
    let expected: Vec<u8> = (0..=255u8).cycle().take(256 * 4099).collect();
    let back = cw.get("out/report.bin").await;
    assert_eq!(back.status, StatusCode::OK);
    assert!(back.body[..] == expected[..], "downloaded bytes differ");
    let empty = cw.get("out/empty").await;
    assert_eq!(empty.status, StatusCode::OK);
    assert!(empty.body.is_empty());

    let listing = cw.get("out").await;
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
    let root = s.api.get("/v1/sessions/cw/files", Some(TOKEN)).await;
    assert_eq!(root.status, StatusCode::OK, "{}", root.json());
    assert!(root.json()["entries"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "out" && e["kind"] == "dir"));
    let missing = cw.get("out/nope").await;
    assert_eq!(missing.error(StatusCode::NOT_FOUND), "not_found");
    s.finish().await;
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
async fn traversal_absolute_paths_and_planted_symlinks_are_refused_and_nothing_outside_is_touched()
{
    let s = server("files-escape", |_| {}).await;
    let esc = Session::new(&s.api, TOKEN, "esc");
    esc.run(
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
        let reply = match method {
            Method::PUT => esc.put(path, b"evil").await,
            Method::GET => esc.get(path).await,
            _ => esc.delete(path).await,
        };
        assert_eq!(
            reply.error(StatusCode::BAD_REQUEST),
            code,
            "{method} {path}"
        );
    }
    // A tar into a directory reached through a symlink is refused the same way.
    let reply = esc.put_tar("tmpdir", tar_of(&[("a", b"1")])).await;
    assert_eq!(reply.error(StatusCode::BAD_REQUEST), "not_a_directory");
    // Writing over a symlink's name replaces the link; its target is untouched.
    let reply = esc.put("environ", b"mine").await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    let result = esc
        .run(
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
    let cap = Session::new(&s.api, TOKEN, "cap");
    cap.run("x = 1").await;
    // Declared too large: refused before anything reaches the kernel.
    let reply = cap.put("big.bin", vec![1; 1024 * 1024 + 1]).await;
    assert_eq!(reply.error(StatusCode::PAYLOAD_TOO_LARGE), "file_too_large");
    // Streamed without a length: cut at the cap, the partial file removed.
    let reply = cap.put_streamed("d/big.bin", 40, 64 * 1024).await;
    assert_eq!(reply.error(StatusCode::PAYLOAD_TOO_LARGE), "file_too_large");
    let reply = cap.put_streamed("d/ok.bin", 16, 64 * 1024).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    let result = cap
        .run("import os\nprint(sorted(os.listdir('.')), sorted(os.listdir('d')), os.path.getsize('d/ok.bin'))")
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
    let full = Session::new(&s.api, TOKEN, "full");
    full.run("import os\nos.mkdir('was')\nopen('keep.bin', 'wb').write(b'k' * (4 * 1024 * 1024))")
        .await;
    let reply = full.put("big.bin", vec![7; 6 * 1024 * 1024]).await;
    assert_eq!(reply.error(StatusCode::INSUFFICIENT_STORAGE), "no_space");
    // The directories an upload made on its way go with it; those that were there stay.
    let reply = full.put("new/deep/big.bin", vec![7; 6 * 1024 * 1024]).await;
    assert_eq!(reply.error(StatusCode::INSUFFICIENT_STORAGE), "no_space");
    let tar = tar_of(&[("a.bin", &vec![1u8; 6 * 1024 * 1024])]);
    let reply = full.put_tar("t", tar.clone()).await;
    assert_eq!(reply.error(StatusCode::INSUFFICIENT_STORAGE), "no_space");
    let reply = full.put_tar("was/t/u", tar).await;
    assert_eq!(reply.error(StatusCode::INSUFFICIENT_STORAGE), "no_space");
    let result = full
        .run("import os\nprint(sorted(os.listdir('.')), os.listdir('was'), os.path.getsize('keep.bin'))")
        .await;
    assert_eq!(
        output(&result),
        "['.kernelbox', 'keep.bin', 'was'] [] 4194304",
        "{result}"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn no_kernel_other_tenants_and_children_are_isolated() {
    let s = server("files-isolation", |_| {}).await;
    let iso = Session::new(&s.api, TOKEN, "iso");
    let theirs = Session::new(&s.api, OTHER, "iso");
    // A session that never ran, for every read verb: 404 no_kernel, and nothing is started.
    let reply = iso.get("a.txt").await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    let reply = s.api.get("/v1/sessions/iso/files", Some(TOKEN)).await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    let reply = iso.delete("a.txt").await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    assert!(s.api.kernels(TOKEN).await.is_empty());

    let reply = iso.put("a.txt", b"mine").await;
    assert_eq!(reply.status, StatusCode::CREATED);
    // Another tenant naming the same session reaches nothing of it.
    let reply = theirs.get("a.txt").await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    let reply = theirs.delete("a.txt").await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    // Its upload starts its own kernel, and its file stays its own.
    let reply = theirs.put("a.txt", b"theirs").await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(s.tenant_containers("files").await.len(), 1);
    assert_eq!(s.tenant_containers("others").await.len(), 1);
    assert_eq!(&iso.get("a.txt").await.body[..], b"mine");
    assert_eq!(&theirs.get("a.txt").await.body[..], b"theirs");

    // A delegated child's kernel has files of its own.
    let child = "c.txt?child=helper";
    let reply = iso.get(child).await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    let reply = iso.put(child, b"child's").await;
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
    let reply = iso.get("c.txt").await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "not_found");
    assert_eq!(&iso.get(child).await.body[..], b"child's");
    let reply = iso.get("c.txt?child=bad::name").await;
    assert_eq!(reply.error(StatusCode::BAD_REQUEST), "invalid_name");

    // Files live and die with the kernel.
    assert_eq!(
        s.api.delete("/v1/sessions/iso", TOKEN).await.status,
        StatusCode::OK
    );
    let reply = iso.get("a.txt").await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn uploads_and_deletes_run_while_a_cell_runs_in_the_same_kernel() {
    let s = server("files-concurrent", |_| {}).await;
    let busy = Session::new(&s.api, TOKEN, "busy");
    busy.run("x = 1").await;
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
        let busy = &busy;
        async move {
            busy.put(&format!("up{i}.bin"), vec![i as u8; 1024 * 1024])
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
    busy.run("import os\nos.makedirs('tree/a/b')\nopen('tree/a/b/f', 'w').write('x')\nos.symlink('/tmp', 'tree/link')\nopen('/tmp/keep', 'w').write('k')")
        .await;
    let reply = busy.delete("up0.bin").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    assert_eq!(reply.json()["deleted"], "/work/up0.bin");
    let reply = busy.delete("tree").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    let reply = busy.delete("tree").await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "not_found");
    let result = busy
        .run("import os\nprint(os.path.exists('up0.bin'), os.path.exists('tree'), open('/tmp/keep').read())")
        .await;
    assert_eq!(output(&result), "False False k", "{result}");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_mib_streams_in_and_out_without_growing_the_server() {
    let served = Served::start("files-stream-memory", TOKEN, &[]).await;
    let (api, pid) = (&served.api, served.process.id().unwrap());
    let mem = Session::new(api, TOKEN, "mem");
    // Warm up: the kernel, the helper path, the allocator's pools.
    let reply = mem.put("warm.bin", vec![1; 4 * 1024 * 1024]).await;
    assert_eq!(reply.status, StatusCode::CREATED);
    let _ = mem.get("warm.bin").await;
    let (rss_before, hwm_before) = memory_of(pid);

    let size = 100 * 1024 * 1024;
    let started = std::time::Instant::now();
    let reply = mem.put_streamed("big.bin", 100, 1024 * 1024).await;
    let upload = started.elapsed();
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    assert_eq!(reply.json()["size"], size);

    let started = std::time::Instant::now();
    let req = api
        .build(Method::GET, &mem.url("big.bin"), Some(TOKEN), false, false)
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
    served.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kernelbox_cp_copies_files_and_directories_both_ways() {
    let served = Served::start("files-cp", TOKEN, &[]).await;
    let cps = Session::new(&served.api, TOKEN, "cps");
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
            .args(["--url", &served.api.base, "--token", TOKEN])
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
    let result = cps
        .run("import hashlib, os\nprint(hashlib.sha256(open('in/data.bin','rb').read()).hexdigest(), sorted(os.listdir('proj')))")
        .await;
    assert_eq!(
        output(&result),
        format!("{} ['main.py', 'sub']", hex::encode(Sha256::digest(&data)))
    );
    cps.run("import os\nos.makedirs('out/deep')\nopen('out/deep/r.txt','w').write('result')\nos.symlink('/etc/passwd', 'out/pw')\n\
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
    served.finish().await;
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
    let idle = Duration::from_secs(2);
    let s = server("files-reaper", |c| c.kernel_idle_timeout = idle).await;
    let slow = Session::new(&s.api, TOKEN, "slow");
    slow.run("x = 'kept'").await;
    // An upload whose body the test paces: it is in flight for longer than the idle timeout.
    let (tx, upload) = slow.paced_put("slow.bin");
    tx.send(Ok(Frame::data(Bytes::from_static(b"first;"))))
        .await
        .unwrap();
    // Let the idle timeout pass while the transfer is in flight, then make the registry reap
    // (every new attach reaps idle kernels first).
    tokio::time::sleep(idle + Duration::from_millis(500)).await;
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
    let reply = upload.await.unwrap().unwrap();
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    // The transfer touched the kernel's last use: it is not idle since before the upload.
    let kernels = s.api.kernels(TOKEN).await;
    let kernel = kernels
        .iter()
        .find(|k| k["session"] == "slow")
        .expect("the kernel");
    assert!(kernel["idle_seconds"].as_f64().unwrap() < 1.5, "{kernel}");
    let result = slow.run("print(x, open('slow.bin').read())").await;
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
    let proj = Session::new(&s.api, TOKEN, "proj");
    let reply = proj.put("sub/up.txt", b"uploaded").await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    assert_eq!(reply.json()["path"], "/work/sub/up.txt");
    assert_eq!(
        std::fs::read_to_string(project.path().join("sub/up.txt")).unwrap(),
        "uploaded"
    );
    let back = proj.get("host.txt").await;
    assert_eq!(&back.body[..], b"from the host");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upload_whose_client_breaks_off_leaves_nothing_half_written() {
    let s = server("files-broken", |_| {}).await;
    let brk = Session::new(&s.api, TOKEN, "brk");
    brk.run("open('keep.txt', 'w').write('old')").await;
    for name in ["keep.txt", "new.bin"] {
        let (tx, upload) = brk.paced_put(name);
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
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while s.api.kernels(TOKEN).await[0]["attached"] != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the transfers never ended"
        );
        tokio::task::yield_now().await;
    }
    let check = "import os\nprint(sorted(os.listdir('.')), open('keep.txt').read())";
    assert_eq!(
        output(&brk.run(check).await),
        "['.kernelbox', 'keep.txt'] old"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_download_the_client_stops_reading_is_cut_and_frees_its_kernel_for_others() {
    let served = Served::start(
        "files-stalled-download",
        TOKEN,
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
    let (held, other) = (
        Session::new(&served.api, TOKEN, "held"),
        Session::new(&served.api, TOKEN, "other"),
    );
    let reply = held.put("big.bin", vec![7; 20 * 1024 * 1024]).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    let stalled = held.stalled_get("big.bin").await;
    // While the download holds the only kernel, another session cannot get one.
    let freed =
        until_another_session_runs(&served.api, "the stalled download", Duration::from_secs(30))
            .await;
    eprintln!("a stalled download released its kernel after {freed:?}");
    // A second stalled download cannot hold SIGTERM's drain (120 s here) either.
    let reply = other.put("big.bin", vec![7; 20 * 1024 * 1024]).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    let stalled_again = other.stalled_get("big.bin").await;
    let stopping = std::time::Instant::now();
    served.finish().await;
    let stopped = stopping.elapsed();
    assert!(
        stopped < Duration::from_secs(30),
        "SIGTERM waited {stopped:?} for a stalled download"
    );
    drop((stalled, stalled_again));
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_session_cuts_its_download_the_client_stopped_reading_and_does_not_wait_on_it() {
    // A real `kernelbox serve`: the in-process server's download did not leave the engine
    // waiting on the exec's unread output.
    let s = Served::start("files-delete-stalled", TOKEN, &[]).await;
    let held = Session::new(&s.api, TOKEN, "held");
    let size = 32 * 1024 * 1024;
    let reply = held.put("big.bin", vec![7; size]).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    let mut stalled = held.stalled_get("big.bin").await;
    // The session goes while its download is stalled: the engine's removal of the container
    // must not wait on the download's unread output.
    let deleting = std::time::Instant::now();
    let reply = s
        .api
        .send_bytes(
            Method::DELETE,
            "/v1/sessions/held",
            Some(TOKEN),
            false,
            None,
        )
        .await;
    let took = deleting.elapsed();
    assert!(
        reply.status.is_success(),
        "{} {}",
        reply.status,
        reply.json()
    );
    eprintln!("DELETE beside a stalled download took {took:?}");
    assert!(
        took < Duration::from_secs(10),
        "DELETE waited {took:?} on a download its client stopped reading"
    );
    // The download was cut, not completed: the client gets less than the file, then the end.
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match tokio::time::timeout(
            Duration::from_secs(60),
            tokio::io::AsyncReadExt::read(&mut stalled, &mut buf),
        )
        .await
        .expect("the cut download's connection ends")
        {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    assert!(
        got < size,
        "the download completed ({got} bytes) after its kernel went"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_non_utf8_name_is_listed_with_replacement_characters_and_long_names_stay_in_bound() {
    let s = server("files-names", |_| {}).await;
    let names = Session::new(&s.api, TOKEN, "names");
    let result = names
        .run(
            "import os\nos.makedirs('bad')\nopen(b'bad/\\xff\\xfe', 'w').close()\n\
             open('bad/ok', 'w').close()\nos.makedirs('long')\n\
             for i in range(10000):\n    open('long/%05d' % i + '\\x01' * 245, 'w').close()\n\
             print('made')",
        )
        .await;
    assert_eq!(output(&result), "made", "{result}");
    let reply = names.get("bad").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    let listed: Vec<String> = reply.json()["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        listed,
        vec!["ok".to_string(), "\u{FFFD}\u{FFFD}".to_string()]
    );
    // 10,000 names that JSON escapes six-fold would pass the header bound: the listing is
    // truncated within it instead of failing.
    let reply = names.get("long").await;
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

#[tokio::test(flavor = "multi_thread")]
async fn an_upload_cut_by_deleting_its_session_answers_no_kernel() {
    let s = server("files-cut-upload", |_| {}).await;
    let cut = Session::new(&s.api, TOKEN, "cut");
    let (tx, upload) = cut.paced_put("slow.bin");
    let feeder = tokio::spawn(async move {
        for _ in 0..600 {
            if tx
                .send(Ok(Frame::data(Bytes::from(vec![b'u'; 1024]))))
                .await
                .is_err()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    // Until the helper has its temporary file, the upload is not under way.
    let started = std::time::Instant::now();
    loop {
        let result = cut
            .run("import glob\nprint(len(glob.glob('.kernelbox-upload-*')))")
            .await;
        if output(&result) == "1" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{result}");
    }
    let reply = s.api.delete("/v1/sessions/cut", TOKEN).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    let reply = tokio::time::timeout(Duration::from_secs(60), upload)
        .await
        .expect("the upload answers")
        .unwrap()
        .unwrap();
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    feeder.abort();
    s.finish().await;
}

/// Reads `reader` 4 KiB at a time with `pause` between reads (about 4 KiB per `pause`, never
/// stalled long enough for the send timeout), until it ends or `reads` reads are done.
fn trickle(
    mut reader: tokio::net::TcpStream,
    pause: Duration,
    reads: usize,
) -> tokio::task::JoinHandle<usize> {
    use tokio::io::AsyncReadExt;
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        let mut total = 0usize;
        for _ in 0..reads {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
            tokio::time::sleep(pause).await;
        }
        total
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_download_read_slower_than_the_minimum_rate_is_cut_and_frees_its_kernel() {
    let s = server("files-slow-download", |c| {
        c.max_session_kernels = 1;
        c.download_min_rate = 1024 * 1024;
        c.download_rate_grace = Duration::from_secs(2);
    })
    .await;
    let slow = Session::new(&s.api, TOKEN, "slow");
    let reply = slow.put("big.bin", vec![7; 20 * 1024 * 1024]).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    let reader = slow.stalled_get("big.bin").await;
    // 40 KiB/s: far below the minimum rate.
    let trickle = trickle(reader, Duration::from_millis(100), 600);
    let freed =
        until_another_session_runs(&s.api, "the slow download", Duration::from_secs(25)).await;
    eprintln!("a download read at 40 KiB/s released its kernel after {freed:?}");
    trickle.abort();
    s.finish().await;
}

/// Host pids of the file helpers running in `container` (Docker's top: the helper's command
/// line carries its source, whose first line names it).
async fn helper_pids(container: &str) -> Vec<String> {
    let docker = bollard::Docker::connect_with_defaults().unwrap();
    let top = docker
        .top_processes(
            container,
            Some(bollard::query_parameters::TopOptions {
                ps_args: "-eo pid,args".into(),
            }),
        )
        .await
        .expect("docker top");
    let mut pids: Vec<String> = top
        .processes
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.iter().any(|f| f.contains("kernelbox file helper")))
        .map(|p| p[0].clone())
        .collect();
    pids.sort();
    pids
}

/// Waits, bounded, until `container` runs `want` file helpers and returns their pids (what
/// it runs at the deadline otherwise): a transfer's helper goes back to its kernel, or ends,
/// a moment after the client has the whole answer.
async fn helpers_settle(container: &str, want: usize) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let pids = helper_pids(container).await;
        if pids.len() == want || std::time::Instant::now() > deadline {
            return pids;
        }
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn transfers_in_a_row_use_one_resident_helper_process() {
    let s = server("files-resident", |_| {}).await;
    let res = Session::new(&s.api, TOKEN, "res");
    // Nothing runs in an idle kernel until files are used.
    res.run("print(1)").await;
    let id = res.container().await;
    assert_eq!(helper_pids(&id).await, Vec::<String>::new());
    let data = random_bytes(3 * 1024 * 1024);
    let mut seen = Vec::new();
    for round in 0..3 {
        let path = format!("f{round}.bin");
        let reply = res.put(&path, data.clone()).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
        let reply = res.get(&path).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.body == data, "round {round}: the bytes differ");
        assert_eq!(res.get("").await.status, StatusCode::OK);
        seen.push(helpers_settle(&id, 1).await);
    }
    eprintln!("helper pids after each round: {seen:?}");
    assert_eq!(seen[0].len(), 1, "{seen:?}");
    assert!(seen.iter().all(|p| *p == seen[0]), "{seen:?}");
    s.finish().await;
}

/// A cell's code that SIGKILLs the kernel's file helpers and prints how many it killed.
const KILL_HELPERS: &str = "import os, signal\nn = 0\nfor p in os.listdir('/proc'):\n    \
    if p.isdigit() and int(p) != os.getpid():\n        try:\n            \
    cmd = open('/proc/%s/cmdline' % p, 'rb').read()\n        except OSError:\n            \
    continue\n        if b'kernelbox file helper' in cmd:\n            \
    os.kill(int(p), signal.SIGKILL); n += 1\nprint(n)";

#[tokio::test(flavor = "multi_thread")]
async fn a_cell_that_kills_the_resident_helper_does_not_fail_the_next_transfers() {
    let s = server("files-killed", |_| {}).await;
    let kill = Session::new(&s.api, TOKEN, "kill");
    let data = random_bytes(1024 * 1024);
    for round in 0..2 {
        let reply = kill.put(&format!("f{round}.bin"), data.clone()).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
        let id = kill.container().await;
        let before = helpers_settle(&id, 1).await;
        assert_eq!(before.len(), 1, "{before:?}");
        let killed = kill.run(KILL_HELPERS).await;
        assert_eq!(output(&killed), "1", "{killed}");
        // Both directions, each on a helper that died while idle.
        let path = format!("g{round}.bin");
        let reply = kill.put(&path, data.clone()).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
        kill.run(KILL_HELPERS).await;
        let reply = kill.get(&path).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
        assert!(reply.body == data, "the bytes differ");
        let after = helpers_settle(&id, 1).await;
        assert_eq!(after.len(), 1, "{after:?}");
        assert_ne!(before, after, "a new helper");
    }
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn uploads_beside_one_holding_the_resident_helper_all_succeed() {
    let s = server("files-beside", |_| {}).await;
    let side = Session::new(&s.api, TOKEN, "side");
    assert_eq!(side.put("warm", "w").await.status, StatusCode::CREATED);
    let id = side.container().await;
    let resident = helpers_settle(&id, 1).await;
    // A slow client: its upload takes the idle resident helper and holds it.
    let (tx, slow) = side.paced_put("slow.bin");
    tx.send(Ok(Frame::data(Bytes::from(vec![b's'; 1024]))))
        .await
        .unwrap();
    // The slow upload is under way (its temporary file exists).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let check =
        "import os\nprint(any(n.startswith('.kernelbox-upload-') for n in os.listdir('.')))";
    while output(&side.run(check).await) != "True" {
        assert!(
            std::time::Instant::now() < deadline,
            "the slow upload never began"
        );
    }
    let data = random_bytes(2 * 1024 * 1024);
    let uploads = (0..4).map(|i| {
        let (side, data) = (&side, data.clone());
        async move { side.put(&format!("c{i}.bin"), data).await }
    });
    let started = std::time::Instant::now();
    let replies = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(uploads))
        .await
        .expect("the uploads beside the slow one never ended");
    eprintln!(
        "4 concurrent uploads beside a held helper: {:?}",
        started.elapsed()
    );
    for reply in &replies {
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    }
    assert!(!slow.is_finished(), "the slow upload ended early");
    tx.send(Ok(Frame::data(Bytes::from(vec![b's'; 1024]))))
        .await
        .unwrap();
    drop(tx);
    let reply = slow.await.unwrap().unwrap();
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    assert_eq!(reply.json()["size"], 2048);
    let check = "import hashlib\nprint(len({hashlib.sha256(open('c%d.bin' % i, 'rb').read()).hexdigest() for i in range(4)}), len(open('slow.bin', 'rb').read()))";
    assert_eq!(output(&side.run(check).await), "1 2048");
    // The one-shot helpers are gone; the resident one stays.
    assert_eq!(helpers_settle(&id, 1).await, resident);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_resident_helper_ends_after_its_idle_time() {
    let idle = Duration::from_secs(2);
    let s = server("files-idle", |c| c.file_helper_idle = idle).await;
    let session = Session::new(&s.api, TOKEN, "idle");
    assert_eq!(session.put("a.txt", "a").await.status, StatusCode::CREATED);
    let used = std::time::Instant::now();
    let id = session.container().await;
    assert_eq!(helpers_settle(&id, 1).await.len(), 1);
    // Polled through the engine, bounded: it is gone within its idle time and a margin.
    let deadline = used + idle + Duration::from_secs(15);
    while !helper_pids(&id).await.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the idle helper was not ended"
        );
        tokio::task::yield_now().await;
    }
    let gone = used.elapsed();
    eprintln!("the idle helper ended {gone:?} after its last use (idle time {idle:?})");
    assert!(gone >= idle, "ended before its idle time: {gone:?}");
    // The next operation starts a new one.
    let reply = session.get("a.txt").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(&reply.body[..], b"a");
    assert_eq!(helpers_settle(&id, 1).await.len(), 1);
    s.finish().await;
}

/// A cell's code that writes `forged` (a Python bytes expression) to the resident helper's
/// stdout from a thread, so the bytes reach the host ahead of the helper's next answer.
fn forge(forged: &str) -> String {
    format!(
        "import os, threading\npids = [p for p in os.listdir('/proc') if p.isdigit() and \
         b'kernelbox file helper' in open('/proc/%s/cmdline' % p, 'rb').read()]\n\
         out = open('/proc/%s/fd/1' % pids[0], 'wb', buffering=0)\n\
         threading.Thread(target=out.write, args=({forged},), daemon=True).start()\n\
         print(len(pids))"
    )
}

/// The helper as a cell sees it: its file descriptors, by the resident helper's pid.
const HELPER_FDS: &str = "import os\npids = [p for p in os.listdir('/proc') if p.isdigit() and \
     b'kernelbox file helper' in open('/proc/%s/cmdline' % p, 'rb').read()]\n\
     kinds = sorted(set(os.readlink('/proc/%s/fd/%s' % (pids[0], f)).split(':')[0] \
     for f in os.listdir('/proc/%s/fd' % pids[0])))\nprint(len(pids), kinds)";

/// File bytes bypass the engine's exec streams: the resident helper holds a socket (its
/// channel), whose name and token are not on its command line (host users read those), the
/// channels' directory cannot be listed or written from a cell, and bytes a cell writes on
/// the helper's stdout (which carries nothing now) fail that one transfer.
#[tokio::test(flavor = "multi_thread")]
async fn transfers_go_over_the_helpers_socket_named_on_no_command_line_in_a_directory_no_cell_lists(
) {
    let served = Served::start("files-channel", TOKEN, &["--pool", "0"]).await;
    let s = Session::new(&served.api, TOKEN, "channel");
    let data = random_bytes(3 * 1024 * 1024 + 7);
    s.round_trip("d.bin", &data).await;
    let result = s.run(HELPER_FDS).await;
    assert_eq!(
        output(&result),
        "1 ['pipe', 'socket']",
        "the resident helper holds no socket: {result}"
    );
    let result = s
        .run(
            "import os\ntry:\n    os.listdir('/run/kernelbox'); print('listed')\n\
             except PermissionError: print('refused')\n\
             try:\n    open('/run/kernelbox/x.sock', 'w'); print('written')\n\
             except OSError as e: print(type(e).__name__)",
        )
        .await;
    assert_eq!(output(&result), "refused\nOSError", "{result}");
    let result = s
        .run(
            "import os\nlines = [open('/proc/%s/cmdline' % p, 'rb').read() for p in os.listdir('/proc') \
             if p.isdigit()]\nhelpers = [l for l in lines if b'kernelbox file helper' in l]\n\
             print(len(helpers), any(b'/run/kernelbox/' in l for l in helpers))",
        )
        .await;
    assert_eq!(output(&result), "1 False", "{result}");
    // Bytes on the helper's stdout: that transfer fails, the next works.
    let result = s.run(&forge("b'Dxxxx'")).await;
    assert_eq!(output(&result), "1", "{result}");
    let reply = s.get("d.bin").await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    let error = reply.json();
    assert_eq!(error["error"]["code"], "file_helper", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("wrote on its stdout"),
        "{error}"
    );
    let reply = s.get("d.bin").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    assert!(reply.body == data, "the bytes differ");
    served.finish().await;
}

/// A cell that takes its helper's invitation (reading the helper's stdin first, as the same
/// user can) keeps that helper from its channel: the upload is answered `transfer_stalled`
/// after the handshake's 15 s, well before the server's 60 s body timeout would drop the
/// client's connection unanswered, and the next upload works on a new helper.
#[tokio::test(flavor = "multi_thread")]
async fn an_upload_whose_helper_never_takes_its_channel_is_answered_before_the_body_timeout() {
    let served = Served::start("files-handshake", TOKEN, &["--pool", "0"]).await;
    let s = Session::new(&served.api, TOKEN, "handshake");
    let result = s
        .run(
            "import os, threading, time\n\
             def steal():\n    \
                 while True:\n        \
                     for p in os.listdir('/proc'):\n            \
                         try:\n                \
                             if p.isdigit() and b'kernelbox file helper' in open('/proc/%s/cmdline' % p, 'rb').read():\n                    \
                                 open('/proc/%s/fd/0' % p, 'rb', buffering=0).read(200)\n                    \
                                 return\n            \
                         except OSError:\n                \
                             pass\n        \
                     time.sleep(0.001)\n\
             threading.Thread(target=steal, daemon=True).start()\nprint('armed')",
        )
        .await;
    assert_eq!(output(&result), "armed", "{result}");
    let started = std::time::Instant::now();
    let reply = s.put("s.txt", b"abc".to_vec()).await;
    let took = started.elapsed();
    assert_eq!(
        reply.status,
        StatusCode::GATEWAY_TIMEOUT,
        "{}",
        reply.json()
    );
    assert_eq!(reply.json()["error"]["code"], "transfer_stalled");
    assert!(took < Duration::from_secs(40), "answered after {took:?}");
    assert_eq!(
        s.put("t.txt", b"def".to_vec()).await.status,
        StatusCode::CREATED
    );
    served.finish().await;
}

/// A kernel whose helper cannot reach the channels' directory (here: made unreachable for
/// the kernel's user after the server started) still moves files, over the exec streams.
#[tokio::test(flavor = "multi_thread")]
async fn a_helper_that_cannot_reach_its_socket_moves_files_over_the_exec_streams() {
    let dir = std::env::temp_dir().join(format!("kb-channel-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let arg = dir.to_string_lossy().into_owned();
    let served = Served::start(
        "files-fallback",
        TOKEN,
        &["--pool", "0", "--file-sockets", &arg],
    )
    .await;
    let s = Session::new(&served.api, TOKEN, "fallback");
    assert_eq!(s.run("1").await["status"], "success");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let data = random_bytes(2 * 1024 * 1024 + 3);
    s.round_trip("d.bin", &data).await;
    let result = s.run(HELPER_FDS).await;
    assert_eq!(output(&result), "1 ['pipe']", "{result}");
    served.finish().await;
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "sockets left behind: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Frames forged on the exec streams (`--file-sockets none`), where a cell can reach them
/// through /proc: with the socket channel it cannot (the next test), but the host reads
/// either channel with the same bounded reader.
#[tokio::test(flavor = "multi_thread")]
async fn forged_resident_helper_output_fails_that_transfer_clearly_and_the_next_works() {
    let served = Served::start(
        "files-forged",
        TOKEN,
        &["--pool", "0", "--file-sockets", "none"],
    )
    .await;
    let pid = served.process.id().unwrap();
    let forger = Session::new(&served.api, TOKEN, "forge");
    let data = random_bytes(1024 * 1024);
    assert_eq!(
        forger.put("d.bin", data.clone()).await.status,
        StatusCode::CREATED
    );
    assert_eq!(forger.get("d.bin").await.status, StatusCode::OK);
    let (_, hwm_before) = memory_of(pid);
    let cases = [
        // A header frame announcing 4 GiB: refused from its 5 bytes.
        (
            "b'H\\xff\\xff\\xff\\xff' + b'x' * 1000",
            "header line is too long",
        ),
        // A frame kind that does not exist.
        ("b'garbage' * 100", "broke its protocol"),
        // A header of 2 MiB (within the bound) that is not JSON: read, then refused.
        (
            "b'H\\x00\\x20\\x00\\x00' + b'[' * (2 << 20)",
            "unreadable header",
        ),
        // A status frame of 1 GiB.
        (
            "b'S\\x40\\x00\\x00\\x00' + b'{' * (1 << 20)",
            "broke its protocol",
        ),
    ];
    for (forged, says) in cases {
        let result = forger.run(&forge(forged)).await;
        assert_eq!(output(&result), "1", "{result}");
        let reply = forger.get("d.bin").await;
        assert_eq!(
            reply.status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "{forged}: {}",
            String::from_utf8_lossy(&reply.body[..reply.body.len().min(300)])
        );
        let error = reply.json();
        assert_eq!(error["error"]["code"], "file_helper", "{error}");
        assert!(
            error["error"]["message"].as_str().unwrap().contains(says),
            "{forged}: {error}"
        );
        // The next transfers, both ways, work on a new helper.
        let reply = forger.get("d.bin").await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
        assert!(reply.body == data, "the bytes differ");
        let reply = forger.put("e.bin", data.clone()).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    }
    let (_, hwm_after) = memory_of(pid);
    let peak = hwm_after.saturating_sub(hwm_before);
    eprintln!(
        "forged helper output: server VmHWM +{:.1} MiB",
        peak as f64 / MIB
    );
    assert!(
        peak < 16 * 1024 * 1024,
        "the server's peak grew by {:.1} MiB",
        peak as f64 / MIB
    );
    served.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_min_download_rate_and_its_grace_set_when_a_slow_download_is_cut() {
    let served = Served::start(
        "files-min-download-rate",
        TOKEN,
        &[
            "--max-kernels",
            "1",
            "--min-download-rate",
            "1m",
            "--download-rate-grace",
            "8s",
        ],
    )
    .await;
    let slow = Session::new(&served.api, TOKEN, "slow");
    let reply = slow.put("big.bin", vec![7; 20 * 1024 * 1024]).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    let reader = slow.stalled_get("big.bin").await;
    // About 200 KiB/s: above the default minimum (64 KiB/s), below the 1 MiB/s asked for; the
    // minimum applies after 8 s (30 s by default).
    let trickle = trickle(reader, Duration::from_millis(20), 5000);
    let freed = until_another_session_runs(
        &served.api,
        "a download read at 200 KiB/s",
        Duration::from_secs(60),
    )
    .await;
    eprintln!("a download read at 200 KiB/s under --min-download-rate 1m released its kernel after {freed:?}");
    assert!(
        freed >= Duration::from_secs(7) && freed < Duration::from_secs(25),
        "not cut at the end of the 8 s grace: {freed:?}"
    );
    trickle.abort();
    served.finish().await;
}

/// A cell stops its resident helper (SIGSTOP) and drips a byte into its stderr every 5 s for
/// 150 s: the next transfer, which gets no frame, still ends at its step deadline
/// (`FILE_IDLE_TIMEOUT`, README "Files in and out of a kernel"), not when the drip stops.
#[tokio::test(flavor = "multi_thread")]
async fn a_cell_dripping_into_a_stopped_helpers_stderr_cannot_stretch_a_transfer() {
    let s = server("files-drip", |_| {}).await;
    let reply = s
        .api
        .put(&files("drip", "x.txt"), TOKEN, b"hello".to_vec(), None)
        .await;
    assert_eq!(reply.status, StatusCode::CREATED);
    let code = "import os, signal, threading, time\n\
        pids = [p for p in os.listdir('/proc') if p.isdigit() and \
        b'kernelbox file helper' in open('/proc/%s/cmdline' % p, 'rb').read()]\n\
        os.kill(int(pids[0]), signal.SIGSTOP)\n\
        err = open('/proc/%s/fd/2' % pids[0], 'wb', buffering=0)\n\
        def drip():\n    end = time.time() + 150\n    while time.time() < end:\n        \
        err.write(b'.')\n        time.sleep(5)\n\
        threading.Thread(target=drip, daemon=True).start()\n\
        print(len(pids))";
    let result = s.api.run(TOKEN, "drip", code).await;
    assert_eq!(output(&result), "1", "{result}");
    let started = std::time::Instant::now();
    let reply = s.api.get(&files("drip", "x.txt"), Some(TOKEN)).await;
    let took = started.elapsed();
    eprintln!(
        "a transfer to a stopped helper fed stderr: {} after {took:?}",
        reply.status
    );
    assert_eq!(
        reply.status,
        StatusCode::GATEWAY_TIMEOUT,
        "{}",
        reply.json()
    );
    assert_eq!(reply.json()["error"]["code"], "transfer_stalled");
    assert!(
        took < std::time::Duration::from_secs(90),
        "the transfer ran {took:?} (the drip lasts 150 s, the step deadline is 60 s)"
    );
    // The stopped helper is never reused: the next transfer works on a new one.
    let reply = s.api.get(&files("drip", "x.txt"), Some(TOKEN)).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(&reply.body[..], b"hello");
    s.finish().await;
}

/// An upload sent steadily for 75 s (longer than the 60 s step deadline, within a raised
/// `--body-timeout`) is written: the helper saying nothing while it receives is no stall.
#[tokio::test(flavor = "multi_thread")]
async fn an_upload_progressing_for_longer_than_the_step_deadline_is_written() {
    use http_body_util::{BodyExt, StreamBody};
    let served = Served::start(
        "files-long-upload",
        TOKEN,
        &["--pool", "0", "--body-timeout", "300s"],
    )
    .await;
    let api = &served.api;
    let (chunks, size) = (150usize, 2048usize);
    let (tx, rx) =
        tokio::sync::mpsc::channel::<Result<hyper::body::Frame<Bytes>, std::io::Error>>(1);
    // A client sending 2 KiB every half second: slow, never stalled.
    let sender = tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
        for _ in 0..chunks {
            tick.tick().await;
            let chunk = hyper::body::Frame::data(Bytes::from(vec![b'a'; size]));
            if tx.send(Ok(chunk)).await.is_err() {
                return;
            }
        }
    });
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::combinators::BoxBody<Bytes, std::io::Error>>();
    let req = api
        .build(
            Method::PUT,
            &files("long", "slow.bin"),
            Some(TOKEN),
            false,
            false,
        )
        .body(
            StreamBody::new(futures::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|chunk| (chunk, rx))
            }))
            .boxed(),
        )
        .unwrap();
    let started = std::time::Instant::now();
    let reply = Reply::read(client.request(req).await.expect("PUT")).await;
    eprintln!(
        "a 75 s upload: {} after {:?}",
        reply.status,
        started.elapsed()
    );
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    assert_eq!(reply.json()["size"], (chunks * size) as u64);
    sender.await.unwrap();
    served.finish().await;
}
