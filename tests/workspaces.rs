//! Workspaces against the real engine (`docs/workspaces.md`): a session's `/work` outlives
//! its kernel (eviction, timeout, idle reap, a restart of the orchestrator), is bounded by
//! its quota from inside and on the host, is swept by TTL but never while a kernel uses it,
//! and is reachable only by its own tenant.

mod common;
#[path = "common/http.rs"]
mod http;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::{engine, unique, CASE};
use kernelbox::config::{WorkspacePolicy, WorkspacesConfig};
use kernelbox::docker::Engine;
use kernelbox::orchestrator::Scope;
use kernelbox::{CellResult, CellStatus, Config, ExecuteRequest, LossReason, Orchestrator};

/// A small quota, so the tests take little disk.
const QUOTA: u64 = 8 * 1024 * 1024;

/// One test's workspaces: its label, its images' directory, the tenants that have them.
struct World {
    label: String,
    dir: PathBuf,
    engine: Arc<dyn Engine>,
    tenants: Vec<&'static str>,
}

impl World {
    async fn new(name: &str, tenants: &[&'static str]) -> World {
        let label = unique(&format!("ws-{name}"));
        World {
            dir: std::env::temp_dir().join(format!("kernelbox-workspaces-{label}")),
            label,
            engine: engine().await,
            tenants: tenants.to_vec(),
        }
    }

    fn config(&self) -> Config {
        let mut config = common::config(&self.label);
        config.workspaces = Some(WorkspacesConfig {
            dir: self.dir.clone(),
            tenants: self
                .tenants
                .iter()
                .map(|t| {
                    (
                        t.to_string(),
                        WorkspacePolicy {
                            quota_bytes: QUOTA,
                            ttl: Duration::from_secs(3600),
                            max: 4,
                        },
                    )
                })
                .collect(),
            total_bytes: None,
        });
        config
    }

    async fn start(&self, tweak: impl FnOnce(&mut Config)) -> Orchestrator {
        let mut config = self.config();
        tweak(&mut config);
        Orchestrator::start(config, self.engine.clone())
            .await
            .expect("orchestrator starts")
    }

    /// This test's workspace volumes, as Docker sees them.
    async fn volumes(&self) -> Vec<String> {
        self.engine
            .list_volumes(
                &[
                    format!("{CASE}={}", self.label),
                    "io.kernelbox.role=workspace".into(),
                ],
                false,
            )
            .await
            .expect("list volumes")
            .into_iter()
            .map(|v| v.name)
            .collect()
    }

    /// Shuts `kb` down, deletes every workspace of the test and asserts nothing is left:
    /// no volume, no image, no loop device.
    async fn finish(self, kb: Orchestrator) {
        kb.shutdown().await;
        let ws = kb.workspaces().expect("workspaces configured");
        for tenant in &self.tenants {
            for w in ws.list(tenant).await.expect("list") {
                ws.delete(tenant, &w.name).await.expect("delete");
            }
        }
        let images: Vec<_> = std::fs::read_dir(&self.dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(images.is_empty(), "images left behind: {images:?}");
        let _ = std::fs::remove_dir_all(&self.dir);
        common::assert_clean(&self.engine, &self.label).await;
    }
}

/// A test that fails leaves no workspace behind either: its containers, volumes, loop
/// devices and images go (a shared engine, a shared host).
impl Drop for World {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let run = |args: &[&str]| {
            std::process::Command::new(args[0])
                .args(&args[1..])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        };
        let filter = format!("label={CASE}={}", self.label);
        for id in run(&["docker", "ps", "-aq", "--filter", &filter]).split_whitespace() {
            run(&["docker", "rm", "-f", id]);
        }
        for v in run(&["docker", "volume", "ls", "-q", "--filter", &filter]).split_whitespace() {
            run(&["docker", "volume", "rm", v]);
        }
        for image in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let image = image.path().to_string_lossy().into_owned();
            for line in run(&["losetup", "-j", &image]).lines() {
                if let Some((dev, _)) = line.split_once(':') {
                    run(&["losetup", "-d", dev]);
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn scope(tenant: &str, session: &str) -> Scope {
    Scope::session(session).tenant(tenant)
}

async fn run(kb: &Orchestrator, tenant: &str, session: &str, code: &str) -> CellResult {
    kb.execute(ExecuteRequest::new(scope(tenant, session), code))
        .await
        .expect("execute")
}

const WRITE: &str = "open('/work/notes.txt', 'w').write('kept')";
const READ: &str = "print(open('/work/notes.txt').read())";

/// The next kernel of the session finds the file, says its workspace was restored, and
/// reports the loss of the previous kernel's memory as `reason`.
async fn reads_back(kb: &Orchestrator, session: &str, reason: LossReason) {
    let r = run(kb, "acme", session, READ).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert_eq!(r.output, "kept\n");
    let ws = r.kernel.workspace.expect("the result names the workspace");
    assert_eq!((ws.name.as_str(), ws.restored), (session, true));
    let lost = r.kernel.state_lost.expect("the memory loss is reported");
    assert_eq!(lost.reason, reason);
    assert!(!lost.workspace_lost, "{lost:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_survive_eviction_timeout_idle_reap_and_a_restart() {
    let world = World::new("survive", &["acme"]).await;
    let kb = world.start(|_| {}).await;
    let first = run(&kb, "acme", "s", WRITE).await;
    assert_eq!(first.status, CellStatus::Success, "{first:?}");
    let ws = first
        .kernel
        .workspace
        .expect("the result names the workspace");
    assert_eq!((ws.name.as_str(), ws.restored), ("s", false));
    assert_eq!(world.volumes().await.len(), 1);

    // Eviction.
    assert_eq!(kb.evict_session(Some("acme"), "s").await, 1);
    reads_back(&kb, "s", LossReason::Evicted).await;

    // A timeout kills the kernel.
    let timed_out = kb
        .execute(ExecuteRequest {
            timeout: Some(Duration::from_secs(1)),
            ..ExecuteRequest::new(scope("acme", "s"), "import time; time.sleep(60)")
        })
        .await
        .expect("execute");
    assert_eq!(timed_out.status, CellStatus::Timeout);
    reads_back(&kb, "s", LossReason::Timeout).await;

    // A restart of the orchestrator (everything it ran is removed at its shutdown).
    kb.shutdown().await;
    assert_eq!(world.volumes().await.len(), 1, "the workspace outlives it");
    let kb = world
        .start(|c| c.kernels.idle_timeout = Duration::from_millis(1))
        .await;
    let r = run(&kb, "acme", "s", READ).await;
    assert_eq!(r.output, "kept\n", "{r:?}");
    assert!(r.kernel.workspace.expect("workspace").restored);

    // An idle reap (every kernel is idle past 1 ms).
    kb.reap_once().await;
    reads_back(&kb, "s", LossReason::IdleReaped).await;
    world.finish(kb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_workspace_is_enospc_inside_and_takes_no_more_than_its_quota_on_the_host() {
    let world = World::new("quota", &["acme"]).await;
    let kb = world.start(|_| {}).await;
    let r = run(
        &kb,
        "acme",
        "s",
        "import errno\n\
         try:\n    open('/work/big', 'wb').write(b'x' * (32 * 1024 * 1024))\n\
         except OSError as e:\n    print('errno', errno.errorcode[e.errno])",
    )
    .await;
    assert_eq!(r.output, "errno ENOSPC\n", "{r:?}");
    // The image, beside its generation's stamp (`<volume>.gen`).
    let images: Vec<_> = std::fs::read_dir(&world.dir)
        .expect("images dir")
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "img"))
        .collect();
    assert_eq!(images.len(), 1);
    let meta = images[0].metadata().expect("image metadata");
    use std::os::unix::fs::MetadataExt;
    assert!(
        meta.blocks() * 512 <= QUOTA,
        "the image takes {} bytes on the host, past its quota {QUOTA}",
        meta.blocks() * 512
    );
    let listed = kb
        .workspaces()
        .expect("ws")
        .list("acme")
        .await
        .expect("list");
    assert_eq!(listed.len(), 1);
    assert!(
        listed[0].in_use && listed[0].size_bytes <= QUOTA,
        "{listed:?}"
    );
    // The kernel still works, and deleting files frees the room.
    let r = run(
        &kb,
        "acme",
        "s",
        "import os; os.remove('/work/big'); open('/work/small', 'w').write('ok'); print('ok')",
    )
    .await;
    assert_eq!(r.output, "ok\n", "{r:?}");
    world.finish(kb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ttl_sweep_deletes_an_expired_workspace_and_never_a_live_one() {
    let world = World::new("ttl", &["acme"]).await;
    let kb = world.start(|_| {}).await;
    for session in ["live", "old"] {
        let r = run(&kb, "acme", session, WRITE).await;
        assert_eq!(r.status, CellStatus::Success, "{r:?}");
    }
    assert_eq!(kb.evict_session(Some("acme"), "old").await, 1);
    let ws = kb.workspaces().expect("ws");
    let long_ago = SystemTime::now() - Duration::from_secs(30 * 24 * 3600);
    for session in ["live", "old"] {
        ws.set_last_used("acme", session, long_ago).expect("age it");
    }
    kb.reap_once().await;
    let names: Vec<_> = ws
        .list("acme")
        .await
        .expect("list")
        .into_iter()
        .map(|w| w.name)
        .collect();
    assert_eq!(names, vec!["live".to_string()]);
    assert_eq!(world.volumes().await.len(), 1);
    let r = run(&kb, "acme", "live", READ).await;
    assert_eq!(r.output, "kept\n", "{r:?}");
    // The expired one starts anew, empty.
    let r = run(
        &kb,
        "acme",
        "old",
        "import os; print(os.path.exists('/work/notes.txt'))",
    )
    .await;
    assert_eq!(r.output, "False\n", "{r:?}");
    assert!(!r.kernel.workspace.expect("workspace").restored);
    // Its eviction is reported, and that its files went too.
    let lost = r.kernel.state_lost.expect("the eviction is reported");
    assert_eq!(lost.reason, LossReason::Evicted);
    assert!(lost.workspace_lost, "{lost:?}");
    world.finish(kb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_workspace_is_out_of_reach() {
    let world = World::new("tenants", &["acme", "evil"]).await;
    let kb = world.start(|_| {}).await;
    let r = run(&kb, "acme", "s", WRITE).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    let ws = kb.workspaces().expect("ws");
    // The same session name under another tenant is another workspace.
    assert!(ws.list("evil").await.expect("list").is_empty());
    let err = ws.delete("evil", "s").await.expect_err("not evil's");
    assert!(
        matches!(err, kernelbox::workspace::WorkspaceError::NotFound { .. }),
        "{err}"
    );
    let r = run(
        &kb,
        "evil",
        "s",
        "import os; print(sorted(os.listdir('/work')))",
    )
    .await;
    assert_eq!(r.output, "['lost+found']\n", "{r:?}");
    // And acme's is untouched.
    assert_eq!(kb.evict_session(Some("acme"), "s").await, 1);
    reads_back(&kb, "s", LossReason::Evicted).await;
    assert_eq!(world.volumes().await.len(), 2);
    // A tenant without workspaces has none, and its /work is the kernel's own.
    let err = ws.list("plain").await.expect_err("plain has no workspaces");
    assert!(matches!(
        err,
        kernelbox::workspace::WorkspaceError::Disabled { .. }
    ));
    let r = run(&kb, "plain", "s", "print(open('/work/notes.txt').read())").await;
    assert!(r.kernel.workspace.is_none());
    assert_eq!(r.status, CellStatus::Error, "{r:?}");
    world.finish(kb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_lists_and_deletes_a_tenants_own_workspaces_and_an_upload_past_the_quota_is_507() {
    use hyper::StatusCode;
    use serde_json::json;
    let ws = json!({"quota": "8m", "ttl": "1h", "max": 2});
    let mut acme = http::tenant("acme", "tok-a");
    acme["workspaces"] = ws.clone();
    let mut evil = http::tenant("evil", "tok-e");
    evil["workspaces"] = ws;
    let dir = std::env::temp_dir().join(format!("kernelbox-workspaces-{}", unique("ws-api")));
    let images = dir.clone();
    let tenants = http::tenants(vec![acme, evil]);
    let policies = tenants.workspaces();
    let srv = http::TestServer::start("ws-api", tenants, move |c| {
        c.workspaces = Some(WorkspacesConfig {
            dir: images,
            tenants: policies,
            total_bytes: None,
        })
    })
    .await;
    let api = &srv.api;
    let r = api.run("tok-a", "s", WRITE).await;
    assert_eq!(
        r["kernel"]["workspace"],
        json!({"name": "s", "restored": false})
    );

    let listed = api.get("/v1/workspaces", Some("tok-a")).await.json();
    let list = listed["workspaces"].as_array().expect("list").clone();
    assert_eq!(list.len(), 1, "{listed}");
    assert_eq!(list[0]["name"], "s");
    assert_eq!(list[0]["in_use"], true);
    assert_eq!(list[0]["quota_bytes"], QUOTA);
    // Another tenant sees none and cannot delete it.
    let theirs = api.get("/v1/workspaces", Some("tok-e")).await.json();
    assert_eq!(theirs["workspaces"], json!([]));
    let r = api.delete("/v1/workspaces/s", "tok-e").await;
    assert_eq!(r.error(StatusCode::NOT_FOUND), "workspace_not_found");

    // An upload past the quota: 507, and the workspace is still usable.
    let big = bytes::Bytes::from(vec![b'x'; 12 * 1024 * 1024]);
    let r = api
        .put(&http::files("s", "big.bin"), "tok-a", big, None)
        .await;
    assert_eq!(r.error(StatusCode::INSUFFICIENT_STORAGE), "no_space");
    let r = api.run("tok-a", "s", READ).await;
    assert_eq!(r["output"], "kept\n", "{r}");

    // The tenant's count: a second workspace is made, a third refused (its max is 2).
    let r = api.run("tok-a", "s2", "print(1)").await;
    assert_eq!(r["kernel"]["workspace"]["name"], "s2", "{r}");
    let r = api
        .execute("tok-a", "s3", json!({"code": "print(1)"}))
        .await;
    assert_eq!(
        r.error(StatusCode::TOO_MANY_REQUESTS),
        "too_many_workspaces"
    );
    let r = api.delete("/v1/sessions/s2", "tok-a").await;
    assert!(r.status.is_success(), "{:?}", r.status);
    // The CLI's verb lists and deletes through the same API.
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
            .args(["workspaces", "--url", &api.base, "--token", "tok-a"])
            .args(args)
            .output()
            .expect("kernelbox workspaces");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (code, out) = cli(&["--json", "list"]);
    assert_eq!(code, Some(0), "{out}");
    let listed: serde_json::Value = serde_json::from_str(&out).expect("json");
    let mut names: Vec<&str> = listed
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|w| w["name"].as_str())
        .collect();
    names.sort();
    assert_eq!(names, ["s", "s2"]);
    assert_eq!(cli(&["rm", "s2"]), (Some(0), "deleted s2\n".to_string()));

    // In use: 409 (the CLI exits 2, a refusal); once its session is cleared, deleted.
    assert_eq!(cli(&["rm", "s"]).0, Some(2));
    let r = api.delete("/v1/workspaces/s", "tok-a").await;
    assert_eq!(r.error(StatusCode::CONFLICT), "workspace_in_use");
    let r = api.delete("/v1/sessions/s", "tok-a").await;
    assert!(r.status.is_success(), "{:?}", r.status);
    let r = api.delete("/v1/workspaces/s", "tok-a").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json(), json!({"deleted": "s"}));
    let listed = api.get("/v1/workspaces", Some("tok-a")).await.json();
    assert_eq!(listed["workspaces"], json!([]));
    let r = api.delete("/v1/workspaces/s", "tok-a").await;
    assert_eq!(r.error(StatusCode::NOT_FOUND), "workspace_not_found");
    srv.finish().await;
    let left: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(left.is_empty(), "images left behind: {left:?}");
}

/// A tar of one regular file `name` holding `data`.
fn tar_of(name: &str, data: &[u8]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder.append_data(&mut header, name, data).expect("tar");
    builder.into_inner().expect("tar")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_goes_out_and_in_as_a_tar_without_its_sessions_kernel() {
    use hyper::StatusCode;
    use serde_json::json;
    let ws = json!({"quota": "8m", "ttl": "1h", "max": 4});
    let mut acme = http::tenant("acme", "tok-a");
    acme["workspaces"] = ws.clone();
    let mut evil = http::tenant("evil", "tok-e");
    evil["workspaces"] = ws;
    let dir = std::env::temp_dir().join(format!("kernelbox-workspaces-{}", unique("ws-tar")));
    let images = dir.clone();
    let tenants = http::tenants(vec![acme, evil, http::tenant("plain", "tok-p")]);
    let policies = tenants.workspaces();
    let srv = http::TestServer::start("ws-tar", tenants, move |c| {
        c.workspaces = Some(WorkspacesConfig {
            dir: images,
            tenants: policies,
            total_bytes: None,
        })
    })
    .await;
    let api = &srv.api;
    assert_eq!(api.run("tok-a", "s", WRITE).await["status"], "success");
    let r = api.delete("/v1/sessions/s", "tok-a").await;
    assert_eq!(r.status, StatusCode::OK);

    // Out: the files, and no kernel of the session started for it.
    let r = api.get("/v1/sessions/s/workspace", Some("tok-a")).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    let mut archive = tar::Archive::new(&r.body[..]);
    let mut found = Vec::new();
    for entry in archive.entries().expect("a tar") {
        let mut entry = entry.expect("an entry");
        let path = entry.path().expect("a path").to_string_lossy().into_owned();
        let mut data = String::new();
        if entry.header().entry_type().is_file() {
            std::io::Read::read_to_string(&mut entry, &mut data).expect("read");
        }
        found.push((path, data));
    }
    assert!(
        found.contains(&("notes.txt".to_string(), "kept".to_string())),
        "{found:?}"
    );
    assert!(api.kernels("tok-a").await.is_empty());

    // A client that goes away while the transfer kernel starts leaves nothing behind: the
    // start finishes and the kernel is removed (only the workspace volumes stay).
    {
        use tokio::io::AsyncWriteExt;
        let addr = api.base.trim_start_matches("http://").to_string();
        let mut conn = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        let head = format!(
            "GET /v1/sessions/s/workspace HTTP/1.1\r\nhost: {addr}\r\n\
             authorization: Bearer tok-a\r\n\r\n"
        );
        conn.write_all(head.as_bytes()).await.expect("send");
        // Long enough for the request to reach the transfer kernel's start, not its end.
        tokio::time::sleep(Duration::from_millis(30)).await;
        drop(conn);
        assert!(
            common::wait_gone(&srv.engine, &srv.label, Duration::from_secs(30))
                .await
                .is_some(),
            "a transfer kernel was left: {:?}",
            common::containers(&srv.engine, &srv.label).await
        );
        // A kernel's staging volume goes right after its container.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let staging: Vec<_> = common::volumes(&srv.engine, &srv.label)
                .await
                .into_iter()
                .filter(|v| {
                    v.labels.get("io.kernelbox.role").map(String::as_str) != Some("workspace")
                })
                .collect();
            if staging.is_empty() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "volumes left: {staging:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // Another tenant's, a missing one, a tenant without workspaces: 404.
    for (token, session) in [("tok-e", "s"), ("tok-a", "never"), ("tok-p", "s")] {
        let r = api
            .get(&format!("/v1/sessions/{session}/workspace"), Some(token))
            .await;
        assert_eq!(
            r.error(StatusCode::NOT_FOUND),
            "workspace_not_found",
            "{token} {session}"
        );
    }

    // In: a new workspace made from a tar, without a kernel; the session's first kernel has
    // the files.
    let r = api
        .put(
            "/v1/sessions/t/workspace",
            "tok-a",
            tar_of("in.txt", b"from a tar"),
            Some("application/x-tar"),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert_eq!(r.json()["files"], 1);
    assert!(api.kernels("tok-a").await.is_empty());
    let r = api
        .run("tok-a", "t", "print(open('/work/in.txt').read())")
        .await;
    assert_eq!(r["output"], "from a tar\n", "{r}");
    assert_eq!(r["kernel"]["workspace"]["restored"], true);
    // With a live kernel the same call goes through it.
    let r = api.get("/v1/sessions/t/workspace", Some("tok-a")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(!r.body.is_empty());

    // Past the quota: 507, and nothing of it is left.
    let big = vec![b'x'; 12 * 1024 * 1024];
    let r = api
        .put(
            "/v1/sessions/u/workspace",
            "tok-a",
            tar_of("big.bin", &big),
            Some("application/x-tar"),
        )
        .await;
    assert_eq!(r.error(StatusCode::INSUFFICIENT_STORAGE), "no_space");
    let r = api
        .run(
            "tok-a",
            "u",
            "import os; print(sorted(os.listdir('/work')))",
        )
        .await;
    assert_eq!(r["output"], "['lost+found']\n", "{r}");

    // The workspaces outlive their kernels: the test deletes them.
    for session in ["t", "u"] {
        let r = api
            .delete(&format!("/v1/sessions/{session}"), "tok-a")
            .await;
        assert_eq!(r.status, StatusCode::OK);
    }
    for name in ["s", "t", "u"] {
        let r = api.delete(&format!("/v1/workspaces/{name}"), "tok-a").await;
        assert_eq!(r.status, StatusCode::OK, "{name}");
    }
    srv.finish().await;
    let left: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(left.is_empty(), "images left behind: {left:?}");
}

/// Deleting a workspace while its session's kernel starts never leaves the kernel a `/work`
/// that is not the workspace's image (docs/workspaces.md, "Quota"): each round clears the
/// session's kernel (its workspace stays), then sends a delete of the workspace and an
/// execute together, the delete a little later each round so that it lands anywhere in the
/// start. Through the Docker API, the workspace's volume is never one the engine made by
/// itself (no kernelbox labels), and every kernel that ran saw a `/work` of its quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_racing_a_kernels_start_never_leaves_it_a_work_past_its_quota() {
    use hyper::StatusCode;
    use serde_json::json;
    const ROUNDS: u64 = 24;
    const SIZE: &str = "import os\ns = os.statvfs('/work')\nprint(s.f_blocks * s.f_frsize)";
    let mut acme = http::tenant("acme", "tok-a");
    acme["workspaces"] = json!({"quota": "8m", "ttl": "1h", "max": 2});
    let label = unique("ws-race");
    let dir = std::env::temp_dir().join(format!("kernelbox-workspaces-{label}"));
    let images = dir.clone();
    let tenants = http::tenants(vec![acme]);
    let policies = tenants.workspaces();
    let srv = http::TestServer::start("ws-race", tenants, move |c| {
        c.workspaces = Some(WorkspacesConfig {
            dir: images,
            tenants: policies,
            total_bytes: None,
        })
    })
    .await;
    let api = &srv.api;
    let engine = engine().await;
    let volume = kernelbox::workspace::volume_name(&dir, "acme", "s");
    let mut problems = Vec::new();
    let (mut ran, mut deleted, mut refused) = (0, 0, 0);
    for round in 0..ROUNDS {
        // The workspace exists with no kernel on it.
        let r = api.run("tok-a", "s", "print(1)").await;
        assert_eq!(r["status"], "success", "{r}");
        let r = api.delete("/v1/sessions/s", "tok-a").await;
        assert!(r.status.is_success(), "{:?}", r.status);
        let stagger = Duration::from_millis(round * 15 % 240);
        let (executed, removed) =
            tokio::join!(api.execute("tok-a", "s", json!({ "code": SIZE })), async {
                tokio::time::sleep(stagger).await;
                api.delete("/v1/workspaces/s", "tok-a").await
            });
        match removed.status {
            StatusCode::OK => deleted += 1,
            StatusCode::CONFLICT => {
                assert_eq!(removed.error(StatusCode::CONFLICT), "workspace_in_use");
                refused += 1;
            }
            other => problems.push(format!("round {round}: delete answered {other}")),
        }
        if executed.status == StatusCode::OK {
            let result = executed.json();
            if result["status"] == "success" {
                ran += 1;
                let size: u64 = result["output"]
                    .as_str()
                    .and_then(|o| o.trim().parse().ok())
                    .unwrap_or(u64::MAX);
                if !(QUOTA / 2..=QUOTA).contains(&size) {
                    problems.push(format!("round {round}: /work of {size} bytes"));
                }
            } else {
                problems.push(format!("round {round}: {result}"));
            }
        } else {
            problems.push(format!(
                "round {round}: execute answered {}: {}",
                executed.status,
                String::from_utf8_lossy(&executed.body)
            ));
        }
        // Whatever volume of the workspace's name exists is kernelbox's workspace.
        let found = engine.list_volumes(&[], false).await.expect("list volumes");
        if let Some(v) = found.iter().find(|v| v.name == volume) {
            if v.labels.get("io.kernelbox.role").map(String::as_str) != Some("workspace") {
                problems.push(format!("round {round}: an unlabelled volume {volume}"));
            }
        }
        // The session has a kernel when the execute started one.
        let r = api.delete("/v1/sessions/s", "tok-a").await;
        assert!(
            r.status.is_success() || r.status == StatusCode::NOT_FOUND,
            "{:?}",
            r.status
        );
    }
    eprintln!("{ROUNDS} rounds: {ran} kernels ran, {deleted} deletes, {refused} refused (409)");
    let r = api.delete("/v1/workspaces/s", "tok-a").await;
    assert!(
        r.status == StatusCode::OK || r.status == StatusCode::NOT_FOUND,
        "{:?}",
        r.status
    );
    srv.finish().await;
    // A volume the engine made by itself carries none of the test's labels: removed here
    // by its name, before anything is asserted.
    let _ = kernelbox::docker::remove_volume_when_free(engine.as_ref(), &volume).await;
    let left: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(left.is_empty(), "images left behind: {left:?}");
    assert!(ran > 0, "no kernel ran");
}
