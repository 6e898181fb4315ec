//! Files in and out of a session's kernel (README "Files in and out of a kernel"), end to end:
//! the real server over real HTTP, real kernels on the real engine, the helper inside them.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use bytes::Bytes;
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
