//! A workspace's disk against the real engine (`docs/workspaces.md`, "Quota";
//! `docs/reliability.md`, "Workspace disk"): a sparse file or hard links never make a tar
//! larger than the workspace's file system, a single sparse file larger than its file system
//! is refused, and what goes out is a usable tar (GNU tar extracts it).

mod common;
#[path = "common/http.rs"]
mod http;

use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, StatusCode};
use kernelbox::config::WorkspacesConfig;
use serde_json::json;

use common::unique;

/// Bytes a bounded download reads at most: far past what a 16 MiB workspace's tar needs.
const READ_CAP: usize = 64 * 1024 * 1024;

/// GETs `path` as a tar, reading at most [`READ_CAP`] bytes: the status and the body, or
/// `None` for the body when it went on past the cap (an unbounded stream).
async fn bounded_tar(api: &http::Api, path: &str, token: &str) -> (StatusCode, Option<Vec<u8>>) {
    let req = api
        .build(Method::GET, path, Some(token), false, false)
        .header(hyper::header::ACCEPT, "application/x-tar")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let response = api.http.request(req).await.expect("HTTP request");
    let status = response.status();
    let mut body = response.into_body();
    let mut got = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            // A stream cut short is no tar; say so by what it held.
            break;
        };
        if let Some(data) = frame.data_ref() {
            got.extend_from_slice(data);
            if got.len() > READ_CAP {
                return (status, None);
            }
        }
    }
    (status, Some(got))
}

/// Extracts `tar` with the host's GNU tar into `dir`.
fn gnu_extract(tar: &[u8], dir: &Path) {
    std::fs::create_dir_all(dir).expect("dir");
    let file = dir.with_extension("tar");
    std::fs::write(&file, tar).expect("write the tar");
    let out = std::process::Command::new("tar")
        .arg("-xf")
        .arg(&file)
        .arg("-C")
        .arg(dir)
        .output()
        .expect("GNU tar runs");
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "GNU tar: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What a cell writes: a 10 GiB sparse file holding `hello` at 5 GB, and a 1 MiB file with
/// 40 more names (hard links), in `/work/d`, in a workspace of 16 MiB.
const SPARSE: &str = "import os\nos.makedirs('/work/d', exist_ok=True)\n\
with open('/work/d/sparse.bin', 'wb') as f:\n    f.truncate(10 << 30)\n    f.seek(5_000_000_000)\n    f.write(b'hello')\n\
open('/work/d/one.bin', 'wb').write(b'x' * (1 << 20))\n\
for i in range(40):\n    os.link('/work/d/one.bin', '/work/d/link%d.bin' % i)\n\
print(os.stat('/work/d/sparse.bin').st_size)";

/// Checks an extracted copy of `/work/d`: the sparse file's size and its bytes at 5 GB, the
/// hard links' content.
fn check_extracted(dir: &Path) {
    use std::io::{Read, Seek};
    let sparse = dir.join("sparse.bin");
    let meta = std::fs::metadata(&sparse).expect("the sparse file is in the tar");
    assert_eq!(meta.len(), 10 << 30);
    let mut f = std::fs::File::open(&sparse).expect("open");
    f.seek(std::io::SeekFrom::Start(5_000_000_000))
        .expect("seek");
    let mut five = [0u8; 5];
    f.read_exact(&mut five).expect("read");
    assert_eq!(&five, b"hello");
    assert_eq!(
        std::fs::metadata(dir.join("link39.bin"))
            .expect("a link")
            .len(),
        1 << 20
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sparse_file_never_makes_a_workspace_tar_larger_than_its_disk() {
    let ws = json!({"quota": "16m", "ttl": "1h", "max": 4});
    let mut acme = http::tenant("acme", "tok-a");
    acme["workspaces"] = ws;
    let dir = std::env::temp_dir().join(format!("kernelbox-workspaces-{}", unique("ws-sparse")));
    let _leftovers = Leftovers(dir.clone());
    let images = dir.clone();
    let tenants = http::tenants(vec![acme]);
    let policies = tenants.workspaces();
    let srv = http::TestServer::start("ws-sparse", tenants, move |c| {
        c.workspaces = Some(WorkspacesConfig {
            dir: images,
            tenants: policies,
            total_bytes: None,
        })
    })
    .await;
    let api = &srv.api;
    let r = api.run("tok-a", "s", SPARSE).await;
    assert_eq!(r["output"], format!("{}\n", 10u64 << 30), "{r}");
    let scratch: PathBuf = dir.with_extension("out");

    // Through the live kernel: the directory as a tar, and the whole workspace.
    for (n, path) in ["/v1/sessions/s/files/d", "/v1/sessions/s/workspace"]
        .into_iter()
        .enumerate()
    {
        let (status, body) = bounded_tar(api, path, "tok-a").await;
        assert_eq!(status, StatusCode::OK, "{path}");
        let body = body.unwrap_or_else(|| panic!("{path}: the tar went past {READ_CAP} bytes"));
        assert!(body.len() < 16 << 20, "{path}: {} bytes", body.len());
        eprintln!("{path}: a tar of {} bytes", body.len());
        let out = scratch.join(n.to_string());
        gnu_extract(&body, &out);
        check_extracted(&if n == 0 { out.clone() } else { out.join("d") });
        let _ = std::fs::remove_dir_all(&out);
    }
    // The file alone is refused with a clear error, not streamed as 10 GiB of zeros.
    let r = api
        .get("/v1/sessions/s/files/d/sparse.bin", Some("tok-a"))
        .await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST), "larger_than_disk");

    // Without the session's kernel: the transfer kernel's tar is bounded too.
    let r = api.delete("/v1/sessions/s", "tok-a").await;
    assert_eq!(r.status, StatusCode::OK);
    let (status, body) = bounded_tar(api, "/v1/sessions/s/workspace", "tok-a").await;
    assert_eq!(status, StatusCode::OK);
    let body = body.expect("the transfer kernel's tar went past the cap");
    assert!(body.len() < 16 << 20, "{} bytes", body.len());
    let out = scratch.join("t");
    gnu_extract(&body, &out);
    check_extracted(&out.join("d"));
    let _ = std::fs::remove_dir_all(&scratch);

    let r = api.delete("/v1/workspaces/s", "tok-a").await;
    assert_eq!(r.status, StatusCode::OK);
    srv.finish().await;
    let left: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(left.is_empty(), "images left behind: {left:?}");
}

/// The loop devices bound to images in `dir`, as the host lists them.
fn loops(dir: &Path) -> Vec<String> {
    let out = std::process::Command::new("losetup")
        .args(["-l", "-n", "-O", "NAME,BACK-FILE"])
        .output()
        .expect("losetup runs");
    let prefix = dir.to_string_lossy().into_owned();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&prefix))
        .map(|l| l.split_whitespace().next().unwrap_or_default().to_string())
        .collect()
}

/// Bytes the one image in `dir` takes on the host (its allocated blocks; its generation's
/// stamp beside it is not counted).
fn image_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let images: Vec<_> = std::fs::read_dir(dir)
        .expect("the images' directory")
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "img"))
        .collect();
    assert_eq!(images.len(), 1, "{images:?}");
    images[0].metadata().expect("stat").blocks() * 512
}

/// Waits, bounded, until `ok` holds (the engine unmounts a volume, and the kernel releases
/// a loop device or discards blocks, a moment after the call that causes it returns).
async fn until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !ok() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A server whose tenant `acme` has 16 MiB workspaces in `dir` (and `total` as the host-wide
/// bound).
async fn workspace_server(name: &str, dir: &Path, total: Option<u64>) -> http::TestServer {
    let mut acme = http::tenant("acme", "tok-a");
    acme["workspaces"] = json!({"quota": "16m", "ttl": "1h", "max": 4});
    let tenants = http::tenants(vec![acme]);
    let policies = tenants.workspaces();
    let images = dir.to_path_buf();
    http::TestServer::start(name, tenants, move |c| {
        c.workspaces = Some(WorkspacesConfig {
            dir: images,
            tenants: policies,
            total_bytes: total,
        })
    })
    .await
}

/// Deletes `names` (their sessions first), stops the server and asserts no image and no loop
/// device of `dir` is left.
async fn finish(srv: http::TestServer, dir: &Path, names: &[&str]) {
    for name in names {
        // Its kernel may be gone already: only the workspace's deletion is asserted.
        srv.api
            .delete(&format!("/v1/sessions/{name}"), "tok-a")
            .await;
        let r = srv
            .api
            .delete(&format!("/v1/workspaces/{name}"), "tok-a")
            .await;
        assert_eq!(r.status, StatusCode::OK, "{name}: {:?}", r.body);
    }
    srv.finish().await;
    let left: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let devices = loops(dir);
    let _ = std::fs::remove_dir_all(dir);
    assert!(left.is_empty(), "images left behind: {left:?}");
    assert!(devices.is_empty(), "loop devices left behind: {devices:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_workspace_holds_no_loop_device_and_freed_blocks_go_back_to_the_host() {
    let dir = std::env::temp_dir().join(format!("kernelbox-workspaces-{}", unique("ws-loop")));
    let _leftovers = Leftovers(dir.clone());
    let srv = workspace_server("ws-loop", &dir, None).await;
    let api = &srv.api;
    assert!(loops(&dir).is_empty());

    // A live kernel holds its workspace's device; 8 MiB written take 8 MiB on the host.
    let r = api
        .run(
            "tok-a",
            "s",
            "import os\nopen('/work/notes.txt', 'w').write('kept')\n\
             open('/work/big.bin', 'wb').write(os.urandom(8 << 20))\nos.sync()\nprint('ok')",
        )
        .await;
    assert_eq!(r["output"], "ok\n", "{r}");
    assert_eq!(loops(&dir).len(), 1, "{:?}", loops(&dir));
    let written = image_bytes(&dir);
    assert!(written >= 8 << 20, "{written}");
    // Freed blocks go back to the host (`discard`).
    let r = api
        .run(
            "tok-a",
            "s",
            "import os\nos.remove('/work/big.bin')\nos.sync()\nprint('ok')",
        )
        .await;
    assert_eq!(r["output"], "ok\n", "{r}");
    until("the freed blocks are discarded", || {
        image_bytes(&dir) < 4 << 20
    })
    .await;
    eprintln!(
        "image: {written} bytes taken, {} after the delete",
        image_bytes(&dir)
    );

    // Its kernel gone, the workspace holds no loop device; its next kernel attaches it again
    // and finds its files.
    let r = api.delete("/v1/sessions/s", "tok-a").await;
    assert_eq!(r.status, StatusCode::OK);
    until("the idle workspace's device is released", || {
        loops(&dir).is_empty()
    })
    .await;
    let r = api
        .run("tok-a", "s", "print(open('/work/notes.txt').read())")
        .await;
    assert_eq!(r["output"], "kept\n", "{r}");
    assert_eq!(r["kernel"]["workspace"]["restored"], true, "{r}");
    assert_eq!(loops(&dir).len(), 1, "{:?}", loops(&dir));
    // Listed and sized while idle too.
    let r = api.delete("/v1/sessions/s", "tok-a").await;
    assert_eq!(r.status, StatusCode::OK);
    until("released again", || loops(&dir).is_empty()).await;
    let r = api.get("/v1/workspaces", Some("tok-a")).await;
    assert_eq!(r.json()["workspaces"][0]["name"], "s", "{}", r.json());
    finish(srv, &dir, &["s"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_past_the_host_wide_bound_is_refused() {
    let dir = std::env::temp_dir().join(format!("kernelbox-workspaces-{}", unique("ws-bound")));
    let _leftovers = Leftovers(dir.clone());
    // Room for two 16 MiB workspaces, not three (the tenant's own max is 4).
    let srv = workspace_server("ws-bound", &dir, Some(40 << 20)).await;
    let api = &srv.api;
    for session in ["a", "b"] {
        let r = api.run("tok-a", session, "print('ok')").await;
        assert_eq!(r["output"], "ok\n", "{r}");
    }
    let r = api
        .execute("tok-a", "c", json!({"code": "print('ok')"}))
        .await;
    assert_eq!(r.error(StatusCode::INSUFFICIENT_STORAGE), "workspaces_full");
    let r = api.get("/v1/workspaces", Some("tok-a")).await;
    assert_eq!(
        r.json()["workspaces"].as_array().map(Vec::len),
        Some(2),
        "{}",
        r.json()
    );
    // One deleted, the next one fits.
    let r = api.delete("/v1/sessions/b", "tok-a").await;
    assert_eq!(r.status, StatusCode::OK);
    let r = api.delete("/v1/workspaces/b", "tok-a").await;
    assert_eq!(r.status, StatusCode::OK);
    let r = api.run("tok-a", "c", "print('ok')").await;
    assert_eq!(r["output"], "ok\n", "{r}");
    finish(srv, &dir, &["a", "c"]).await;
}

/// Whatever a failing test made in its images' directory `0` goes (a shared engine, a shared
/// host): the workspace volumes of that directory, their loop devices and the images.
struct Leftovers(PathBuf);

impl Drop for Leftovers {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        use sha2::Digest;
        let run = |args: &[&str]| {
            std::process::Command::new(args[0])
                .args(&args[1..])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        };
        let hash = hex::encode(sha2::Sha256::digest(self.0.as_os_str().as_encoded_bytes()));
        let filter = format!("label=io.kernelbox.workspace-dir={}", &hash[..16]);
        for v in run(&["docker", "volume", "ls", "-q", "--filter", &filter]).split_whitespace() {
            for c in
                run(&["docker", "ps", "-aq", "--filter", &format!("volume={v}")]).split_whitespace()
            {
                run(&["docker", "rm", "-f", c]);
            }
            run(&["docker", "volume", "rm", v]);
        }
        for dev in loops(&self.0) {
            run(&["losetup", "-d", &dev]);
        }
        let _ = std::fs::remove_dir_all(&self.0);
        let _ = std::fs::remove_dir_all(self.0.with_extension("out"));
    }
}

/// A writer the test's log goes to.
#[derive(Clone, Default)]
struct Log(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn start_warns_when_the_quotas_pass_the_free_space_and_bounds_by_it() {
    use kernelbox::config::WorkspacePolicy;
    use kernelbox::workspace::Workspaces;
    let dir = std::env::temp_dir().join(format!("kernelbox-workspaces-{}", unique("ws-warn")));
    let _leftovers = Leftovers(dir.clone());
    let start = |tenants: &[(&str, u64, usize)], total: Option<u64>| {
        let log = Log::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let config = WorkspacesConfig {
            dir: dir.clone(),
            tenants: tenants
                .iter()
                .map(|(name, quota_bytes, max)| {
                    (
                        name.to_string(),
                        WorkspacePolicy {
                            quota_bytes: *quota_bytes,
                            ttl: std::time::Duration::from_secs(3600),
                            max: *max,
                        },
                    )
                })
                .collect(),
            total_bytes: total,
        };
        let engine: std::sync::Arc<dyn kernelbox::docker::Engine> =
            std::sync::Arc::new(kernelbox::docker::fake::FakeEngine::default());
        let ws = tracing::subscriber::with_default(subscriber, || {
            Workspaces::new(engine, config, Default::default()).expect("workspaces")
        });
        let text =
            String::from_utf8_lossy(&log.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned();
        (ws.total_bytes(), text)
    };
    // 100 workspaces of 1 PiB are more than any test host's disk: warned, and bounded by it.
    let (bound, log) = start(&[("acme", 1 << 50, 100)], None);
    assert!(
        log.contains("more than the workspaces' directory has free"),
        "{log}"
    );
    assert!(bound > 0 && bound < 1 << 50, "{bound}");
    // Small quotas: no warning; a configured bound is the bound.
    let (bound, log) = start(&[("acme", 16 << 20, 4)], Some(40 << 20));
    assert!(!log.contains("WARN"), "{log}");
    assert_eq!(bound, 40 << 20);
    let _ = std::fs::remove_dir_all(&dir);
}
