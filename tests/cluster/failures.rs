//! docs/cluster.md, "Leases and fencing": a node killed (its sessions reported `node_lost`
//! elsewhere, its kernels removed by its watchdog), a node stopped past its lease (it fences
//! itself and rejoins with a higher epoch), and the catalog unavailable (new sessions 503,
//! warm ones served, new sessions again once it is back).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hyper::StatusCode;
use serde_json::{json, Value};

use crate::harness::{
    generation, kernel_id, lost, poll, success, Cluster, Node, Options, SLOW, TOKEN,
};
use crate::postgres;

/// Each call in [`served`], at most. A call forwarded to a node that is stopped but not
/// dead (its socket still accepts) waits for the answer until that node resumes, however
/// long its lease has been expired: a client's own deadline ends it.
const CALL: Duration = Duration::from_secs(3);

/// Calls `session` on `node` until it is served (a 503 while the holder is gone but not yet
/// expired: `node_unavailable` or `node_fenced`; a call past [`CALL`]); returns the result
/// and how many calls ran past [`CALL`].
pub(crate) async fn served(node: &Node, session: &str, code: &str) -> (Value, usize) {
    let hung = AtomicUsize::new(0);
    let result = poll(&format!("{session} served by {}", node.name), SLOW, || {
        let call = node.api.execute(TOKEN, session, json!({ "code": code }));
        let hung = &hung;
        async move {
            let Ok(reply) = tokio::time::timeout(CALL, call).await else {
                hung.fetch_add(1, Ordering::Relaxed);
                return None;
            };
            if reply.status == StatusCode::SERVICE_UNAVAILABLE {
                let code = reply.error(StatusCode::SERVICE_UNAVAILABLE);
                assert!(
                    code == "node_unavailable" || code == "node_fenced",
                    "{}",
                    reply.json()
                );
                return None;
            }
            Some(success(&reply))
        }
    })
    .await;
    (result, hung.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_sessions_are_reported_node_lost_on_the_others() {
    let mut cluster = Cluster::start("cl-kill", Options::default()).await;
    let victim = 2;
    let sessions = ["k1", "k2"];
    let mut generations = Vec::new();
    for s in sessions {
        let result = success(
            &cluster.nodes[victim]
                .api
                .execute(TOKEN, s, json!({"code": "x = 1"}))
                .await,
        );
        generations.push(generation(&result));
    }
    assert_eq!(cluster.node_containers(victim).await.len(), 2);

    let killed = Instant::now();
    cluster.kill9(victim).await;
    let mut first_report = None;
    for (i, s) in sessions.iter().enumerate() {
        let (result, hung) = served(&cluster.nodes[i % 2], s, "print('back')").await;
        assert_eq!(
            hung, 0,
            "a call forwarded to a dead node is refused at once"
        );
        first_report.get_or_insert_with(|| killed.elapsed());
        assert_eq!(lost(&result).as_deref(), Some("node_lost"), "{result}");
        assert!(result["kernel"]["state_lost"]["at"].is_string(), "{result}");
        assert_eq!(generation(&result), generations[i] + 1, "{result}");
        assert_eq!(result["output"], "back\n");
    }
    eprintln!(
        "kill -9 to the first node_lost report: {:.2} s (lease TTL 3 s)",
        first_report.expect("a report").as_secs_f64()
    );
    // The killed node's watchdog removes its kernels.
    let gone = poll("the killed node's kernels removed", SLOW, || async {
        cluster
            .node_containers(victim)
            .await
            .is_empty()
            .then(|| killed.elapsed())
    })
    .await;
    eprintln!(
        "kill -9 to its kernels removed: {:.2} s",
        gone.as_secs_f64()
    );
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_goes_back_to_its_workspace_and_a_lost_node_reports_its_workspace_lost() {
    const WRITE: &str = "open('/work/notes.txt', 'w').write('kept')";
    const READ: &str = "import os\nprint(open('/work/notes.txt').read() if os.path.exists('/work/notes.txt') else 'missing')";
    let options = Options {
        workspaces: true,
        ..Options::default()
    };
    let mut cluster = Cluster::start("cl-ws", options).await;
    // A session whose kernel went on purpose is placed back on the node with its workspace,
    // whichever node is asked.
    let first = cluster.nodes[0]
        .api
        .execute(TOKEN, "home", json!({ "code": WRITE }))
        .await;
    assert_eq!(cluster.holder("home").await, Some(0));
    assert_eq!(success(&first)["kernel"]["workspace"]["restored"], false);
    let cleared = cluster.nodes[0]
        .api
        .delete("/v1/sessions/home", TOKEN)
        .await;
    assert_eq!(cleared.status, StatusCode::OK);
    let again = cluster.nodes[1]
        .api
        .execute(TOKEN, "home", json!({ "code": READ }))
        .await;
    let result = success(&again);
    assert_eq!(cluster.holder("home").await, Some(0), "{result}");
    assert_eq!(cluster.nodes[1].sessions().await, Vec::<String>::new());
    assert_eq!(result["output"], "kept\n", "{result}");
    assert_eq!(result["kernel"]["workspace"]["restored"], true);

    // A session whose node is lost starts elsewhere with an empty workspace, and says so.
    let victim = 2;
    let on_victim = cluster.nodes[victim]
        .api
        .execute(TOKEN, "away", json!({ "code": WRITE }))
        .await;
    assert_eq!(
        success(&on_victim)["kernel"]["workspace"]["restored"],
        false
    );
    cluster.kill9(victim).await;
    let (result, _) = served(&cluster.nodes[0], "away", READ).await;
    assert_eq!(lost(&result).as_deref(), Some("node_lost"), "{result}");
    assert_eq!(
        result["kernel"]["state_lost"]["workspace_lost"], true,
        "{result}"
    );
    assert_eq!(result["kernel"]["workspace"]["restored"], false, "{result}");
    assert_eq!(result["output"], "missing\n", "{result}");
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopped_past_its_lease_fences_itself_and_rejoins() {
    let cluster = Cluster::start("cl-stop", Options::default()).await;
    let victim = 0;
    let node = &cluster.nodes[victim];
    let sessions = ["p1", "p2"];
    for s in sessions {
        success(&node.api.execute(TOKEN, s, json!({"code": "x = 1"})).await);
    }
    let old: BTreeSet<String> = cluster
        .node_containers(victim)
        .await
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(old.len(), 2);
    let (status, epoch) = node.health().await;
    assert_eq!(status, StatusCode::OK);
    let epoch = epoch.expect("its epoch");

    node.signal("STOP").await;
    let stopped = Instant::now();
    // Meanwhile the other nodes expire its lease and report its sessions lost.
    let mut first_report = None;
    let mut hung = 0;
    for (i, s) in sessions.iter().enumerate() {
        let (result, h) = served(&cluster.nodes[1 + i], s, "print('elsewhere')").await;
        hung += h;
        first_report.get_or_insert_with(|| stopped.elapsed());
        assert_eq!(lost(&result).as_deref(), Some("node_lost"), "{result}");
    }
    // Stopped for 6 s in all (twice the lease), whatever the reports took.
    tokio::time::sleep_until((stopped + Duration::from_secs(6)).into()).await;
    node.signal("CONT").await;
    let resumed = Instant::now();

    // It fenced itself: none of its old kernels remains.
    let fenced = poll("the stopped node's old kernels removed", SLOW, || async {
        let now: BTreeSet<String> = cluster
            .containers()
            .await
            .into_iter()
            .map(|c| c.id)
            .collect();
        now.is_disjoint(&old).then(|| resumed.elapsed())
    })
    .await;
    // It serves again after rejoining, with a higher epoch.
    let (back, new_epoch) = poll("/healthz 200 after the rejoin", SLOW, || async {
        let (status, epoch) = node.health().await;
        (status == StatusCode::OK).then(|| (resumed.elapsed(), epoch))
    })
    .await;
    let new_epoch = new_epoch.expect("its epoch");
    assert!(new_epoch > epoch, "epoch {epoch} -> {new_epoch}");
    let rows = cluster.node_rows(1).await;
    let row = rows
        .iter()
        .find(|r| r["name"] == node.name.as_str())
        .expect("the node's row");
    assert_eq!(row["state"], "live", "{row}");
    assert_eq!(row["epoch"], new_epoch, "{row}");
    eprintln!(
        "SIGSTOP to the first node_lost elsewhere: {:.2} s ({hung} call(s) forwarded to the stopped node cut by the client after {CALL:?}); SIGCONT (after {:.1} s) to its old kernels removed: {:.2} s, to /healthz 200 (epoch {epoch} -> {new_epoch}): {:.2} s",
        first_report.expect("a report").as_secs_f64(),
        resumed.duration_since(stopped).as_secs_f64(),
        fenced.as_secs_f64(),
        back.as_secs_f64(),
    );
    // The sessions live where they were reported, the stopped node forwards to them.
    for s in sessions {
        let result = success(
            &node
                .api
                .execute(TOKEN, s, json!({"code": "print('again')"}))
                .await,
        );
        assert_eq!(lost(&result), None, "{result}");
    }
    assert!(
        node.sessions().await.is_empty(),
        "nothing of its own after the fence"
    );
    cluster.finish().await;
}

/// The name of the database `url` points at.
fn database_of(url: &str) -> String {
    url.split('?')
        .next()
        .and_then(|u| u.rsplit('/').next())
        .expect("a database name")
        .to_string()
}

/// Takes the cluster's database away (no connection allowed, every one ended) or gives it
/// back: what a node sees of a database that went down.
async fn database_available(db: &str, available: bool) {
    let admin = postgres::raw(&postgres::server_url()).await;
    let name = database_of(db);
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {name} ALLOW_CONNECTIONS {available}"
        ))
        .await
        .expect("ALTER DATABASE");
    if !available {
        admin
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE datname = $1 AND pid <> pg_backend_pid()",
                &[&name],
            )
            .await
            .expect("end the database's connections");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_catalog_unavailable_new_sessions_wait_and_warm_ones_work() {
    // A lease long enough to ride out the outage (docs/cluster.md, "Catalog unavailable").
    let cluster = Cluster::start(
        "cl-catalog",
        Options {
            lease_ttl: "30s",
            fence_margin: "3s",
            ..Options::default()
        },
    )
    .await;
    let node = &cluster.nodes[0];
    let warm = success(
        &node
            .api
            .execute(TOKEN, "warm", json!({"code": "x = 1"}))
            .await,
    );

    database_available(&cluster.db, false).await;
    let down = Instant::now();
    // The node has lost the catalog once its admin listing cannot be answered.
    poll("the node sees the catalog gone", SLOW, || async {
        let reply = node.api.get("/v1/nodes", Some(crate::harness::ADMIN)).await;
        (reply.status == StatusCode::SERVICE_UNAVAILABLE).then_some(())
    })
    .await;
    for (i, n) in cluster.nodes.iter().enumerate() {
        let reply = n
            .api
            .execute(TOKEN, &format!("new{i}"), json!({"code": "1"}))
            .await;
        assert_eq!(
            reply.error(StatusCode::SERVICE_UNAVAILABLE),
            "catalog_unavailable",
            "on {}",
            n.name
        );
    }
    // The warm session is served while the node cannot renew its lease (until the fence).
    poll("a lease renewal failed", SLOW, || async {
        let metrics = node.api.metrics(TOKEN).await;
        metrics
            .lines()
            .find(|l| l.starts_with("kernelbox_cluster_lease_renew_failures_total"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|n| n.parse::<u64>().ok())
            .filter(|n| *n > 0)
    })
    .await;
    let result = success(
        &node
            .api
            .execute(TOKEN, "warm", json!({"code": "x += 1\nprint(x)"}))
            .await,
    );
    assert_eq!(result["output"], "2\n");
    assert_eq!(kernel_id(&result), kernel_id(&warm));
    assert!(
        cluster.containers().await.len() == 1,
        "no kernel for the refused sessions"
    );

    database_available(&cluster.db, true).await;
    let outage = down.elapsed();
    for (i, n) in cluster.nodes.iter().enumerate() {
        let session = format!("new{i}");
        poll(
            &format!("a new session on {} after the outage", n.name),
            SLOW,
            || async {
                let reply = n
                    .api
                    .execute(TOKEN, &session, json!({"code": "print(1)"}))
                    .await;
                (reply.status == StatusCode::OK).then(|| success(&reply))
            },
        )
        .await;
    }
    eprintln!(
        "catalog unavailable for {:.1} s; new sessions served again {:.1} s after it went",
        outage.as_secs_f64(),
        down.elapsed().as_secs_f64()
    );
    let result = success(
        &node
            .api
            .execute(TOKEN, "warm", json!({"code": "x += 1\nprint(x)"}))
            .await,
    );
    assert_eq!(
        result["output"], "3\n",
        "the warm session kept its kernel: {result}"
    );
    assert_eq!(lost(&result), None, "{result}");
    cluster.finish().await;
}

/// Docker's die events of `container` since `since` (Unix seconds, replayed) and on, as Unix
/// nanoseconds, one a line (`docker events`: the engine's own record of when a container
/// stopped).
fn die_events(
    container: &str,
    since: f64,
) -> (
    tokio::process::Child,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) {
    let mut child = tokio::process::Command::new("docker")
        .args(["events", "--format", "{{.TimeNano}}"])
        .args(["--since", &format!("{since:.3}")])
        .args(["--filter", &format!("container={container}")])
        .args(["--filter", "event=die"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("docker events");
    let stdout = child.stdout.take().expect("stdout");
    let lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    (child, lines)
}

/// What the old kernel's ticking thread last wrote (`/tmp/tick`, Unix seconds), read through
/// the engine (`docker exec`); `None` once the container no longer runs.
async fn tick_of(container: &str) -> Option<f64> {
    let out = tokio::process::Command::new("docker")
        .args(["exec", container, "cat", "/tmp/tick"])
        .output()
        .await
        .expect("docker exec");
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// docs/cluster.md, "Leases and fencing": a node whose server is stopped (SIGSTOP: its fence
/// is code of a stopped process) has its kernels killed by its watchdog, a separate process,
/// when the lease the server last renewed stops being trusted (TTL minus the fence margin),
/// so the session's next generation on another node never runs beside the old kernel. The old
/// kernel's thread keeps writing the time until then; Docker's die event for it comes before
/// the new kernel's first cell. After SIGCONT the node fences, rejoins, and leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_nodes_kernels_are_killed_from_outside_before_the_session_runs_elsewhere() {
    const TICK: &str = "import threading, time\n\
        def tick():\n    while True:\n        open('/tmp/tick', 'w').write(repr(time.time()))\n        time.sleep(0.05)\n\
        threading.Thread(target=tick, daemon=True).start()\n\
        time.sleep(0.2)\nprint('ticking')";
    let cluster = Cluster::start("cl-frozen", Options::default()).await;
    let victim = 0;
    let node = &cluster.nodes[victim];
    let first = success(
        &node
            .api
            .execute(TOKEN, "frozen", json!({ "code": TICK }))
            .await,
    );
    assert_eq!(first["output"], "ticking\n", "{first}");
    let old = cluster.node_containers(victim).await;
    assert_eq!(old.len(), 1);
    let old = old[0].id.clone();
    let (_, epoch) = node.health().await;
    let epoch = epoch.expect("its epoch");

    let wall = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("the clock")
            .as_secs_f64()
    };
    poll("the old kernel ticking", SLOW, || tick_of(&old)).await;
    let stopped_at = wall();
    let (mut events, mut deaths) = die_events(&old, stopped_at);
    node.signal("STOP").await;
    let stopped = Instant::now();
    // While the session is asked for elsewhere, the old kernel runs on until the watchdog
    // kills it.
    let last_tick = std::cell::Cell::new(0.0_f64);
    let killed = poll("the stopped node's kernel stops running", SLOW, || {
        let (old, last_tick) = (&old, &last_tick);
        async move {
            match tick_of(old).await {
                Some(t) => {
                    last_tick.set(last_tick.get().max(t));
                    None
                }
                None => Some(()),
            }
        }
    });
    let elsewhere = served(
        &cluster.nodes[1],
        "frozen",
        "import time\nprint(repr(time.time()))",
    );
    let ((), (result, _)) = tokio::join!(killed, elsewhere);
    let last_tick = last_tick.get();
    assert!(
        last_tick > stopped_at,
        "the old kernel ran after its server stopped (last tick {last_tick}, stopped {stopped_at})"
    );
    assert_eq!(lost(&result).as_deref(), Some("node_lost"), "{result}");
    assert_eq!(generation(&result), generation(&first) + 1, "{result}");
    let new_ran: f64 = result["output"]
        .as_str()
        .and_then(|o| o.trim().parse().ok())
        .unwrap_or_else(|| panic!("a time in {result}"));
    let died = tokio::time::timeout(SLOW, deaths.next_line())
        .await
        .expect("the die event")
        .expect("docker events")
        .and_then(|n| n.trim().parse::<u128>().ok())
        .expect("a die event of the old kernel");
    events.kill().await.expect("end docker events");
    let died = died as f64 / 1e9;
    assert!(
        died < new_ran,
        "the old kernel died at {died}, after the new one ran at {new_ran}"
    );
    eprintln!(
        "SIGSTOP to the old kernel killed: {:.2} s (lease TTL 3 s, fence margin 1 s); killed {:.2} s before the new generation's first cell",
        died - stopped_at,
        new_ran - died,
    );

    // Stopped for 6 s in all (twice the lease), then resumed: it fences and rejoins.
    tokio::time::sleep_until((stopped + Duration::from_secs(6)).into()).await;
    node.signal("CONT").await;
    let new_epoch = poll("/healthz 200 after the rejoin", SLOW, || async {
        let (status, epoch) = node.health().await;
        (status == StatusCode::OK).then_some(epoch)
    })
    .await;
    let new_epoch = new_epoch.expect("its epoch");
    assert!(new_epoch > epoch, "epoch {epoch} -> {new_epoch}");
    assert!(
        node.sessions().await.is_empty(),
        "nothing of its own after the fence"
    );
    assert!(cluster.node_containers(victim).await.is_empty());
    let again = success(
        &node
            .api
            .execute(TOKEN, "frozen", json!({"code": "print('again')"}))
            .await,
    );
    assert_eq!(lost(&again), None, "{again}");
    cluster.finish().await;
}

/// docs/cluster.md, "Leases and fencing": a node whose catalog is slow (its lease row held
/// by another transaction, so its renewals wait past `ttl - margin`) is not stopped: it
/// fences itself, and its watchdog kills its kernels at the same deadline. A cell running
/// then is told its node lost its lease, never a kill from outside kernelbox nor a clear,
/// and the session's next call reports `node_lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_cut_by_a_slow_catalogs_deadline_is_told_the_node_was_lost() {
    let cluster = Cluster::start("cl-slowdb", Options::default()).await;
    let victim = 0;
    let node = &cluster.nodes[victim];
    let first = success(
        &node
            .api
            .execute(TOKEN, "slowdb", json!({ "code": "print('up')" }))
            .await,
    );
    let long = node.api.execute(
        TOKEN,
        "slowdb",
        json!({ "code": "import time\ntime.sleep(20)\nprint('done')", "timeout": 30 }),
    );
    let hold = async {
        // The cell is running by now (its kernel is warm).
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut db = postgres::raw(&cluster.db).await;
        let tx = db.transaction().await.expect("begin");
        tx.execute(
            "SELECT 1 FROM kb_nodes WHERE name = $1 FOR UPDATE",
            &[&node.name],
        )
        .await
        .expect("lock the lease row");
        // Past ttl - margin (2 s) and the ttl (3 s): every renewal waits on the lock.
        tokio::time::sleep(Duration::from_secs(5)).await;
        tx.rollback().await.expect("rollback");
    };
    let (reply, ()) = tokio::join!(long, hold);
    let result = reply.json();
    let next = served(node, "slowdb", "print('next')").await.0;
    assert_eq!(reply.status, StatusCode::OK, "{result}");
    let error = result["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("The node running the kernel lost its cluster lease"),
        "{result}"
    );
    assert_eq!(lost(&next).as_deref(), Some("node_lost"), "{next}");
    assert_eq!(generation(&next), generation(&first) + 1, "{next}");
    cluster.finish().await;
}

/// docs/cluster.md, "Leases and fencing": a cell running on a node whose server is stopped
/// past its lease: the watchdog kills its kernel; when the server resumes, the cell's caller
/// is told its node lost its lease (never a kill from outside kernelbox), the node fences
/// and rejoins without a panic, and the session's next call reports `node_lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_running_on_a_stopped_node_is_answered_as_fenced_when_it_resumes() {
    let cluster = Cluster::start("cl-stopcell", Options::default()).await;
    let victim = 0;
    let node = &cluster.nodes[victim];
    let first = success(
        &node
            .api
            .execute(TOKEN, "stopcell", json!({ "code": "print('up')" }))
            .await,
    );
    let old = cluster.node_containers(victim).await;
    assert_eq!(old.len(), 1);
    let long = node.api.execute(
        TOKEN,
        "stopcell",
        json!({ "code": "import time\ntime.sleep(30)\nprint('done')", "timeout": 60 }),
    );
    let freeze = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        node.signal("STOP").await;
        poll("the watchdog kills the kernel", SLOW, || async {
            cluster
                .node_containers(victim)
                .await
                .is_empty()
                .then_some(())
        })
        .await;
        // Past the lease (3 s) so another node may expire it.
        tokio::time::sleep(Duration::from_secs(4)).await;
        node.signal("CONT").await;
    };
    let (reply, ()) = tokio::join!(long, freeze);
    let result = reply.json();
    let next = served(&cluster.nodes[1], "stopcell", "print('next')")
        .await
        .0;
    let log = node.log();
    assert!(!log.contains("panicked"), "{log}");
    assert_eq!(reply.status, StatusCode::OK, "{result}");
    let error = result["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("The node running the kernel lost its cluster lease"),
        "{result}"
    );
    assert_eq!(lost(&next).as_deref(), Some("node_lost"), "{next}");
    assert_eq!(generation(&next), generation(&first) + 1, "{next}");
    cluster.finish().await;
}

/// docs/cluster.md, "Leases and fencing": the deadline a node gives its watchdog does not
/// depend on the server opening a file. A node that can open no descriptor for a while (at
/// its `RLIMIT_NOFILE`, as a tenant flooding it with connections could make it) but keeps
/// renewing its lease over its open connection keeps its kernels: the watchdog is never told
/// a deadline already past.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_out_of_descriptors_but_renewing_keeps_its_kernels() {
    let cluster = Cluster::start("cl-nofile", Options::default()).await;
    let victim = 0;
    let node = &cluster.nodes[victim];
    let first = success(
        &node
            .api
            .execute(TOKEN, "nofile", json!({ "code": "x = 41\nprint('up')" }))
            .await,
    );
    let pid = node.pid();
    // The lowest free descriptor number: a limit there lets no new one open.
    let open: BTreeSet<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the node's descriptors")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let open = (0..).find(|fd| !open.contains(fd)).unwrap_or_default();
    let limit = |soft: &str| {
        let status = std::process::Command::new("prlimit")
            .arg(format!("--pid={pid}"))
            .arg(format!("--nofile={soft}:"))
            .status()
            .expect("prlimit");
        assert!(status.success(), "prlimit --nofile={soft}");
    };
    // No new descriptor while several renewals (every 0.5 s) pass, then the limit back.
    let before = std::process::Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .args(["--nofile", "--output=SOFT", "--noheadings"])
        .output()
        .expect("prlimit");
    let before = String::from_utf8_lossy(&before.stdout).trim().to_string();
    limit(&open.to_string());
    // Renewals for longer than the lease is trusted (ttl - margin: 2 s).
    let since = renewed_at(&cluster, victim).await;
    poll("renewals at the descriptor limit", SLOW, || async {
        (renewed_at(&cluster, victim).await >= since + 2.5).then_some(())
    })
    .await;
    limit(&before);
    let next = success(
        &node
            .api
            .execute(TOKEN, "nofile", json!({ "code": "x += 1\nprint(x)" }))
            .await,
    );
    assert_eq!(next["output"], "42\n", "{next}");
    assert_eq!(generation(&next), generation(&first), "{next}");
    assert_eq!(lost(&next), None, "{next}");
    cluster.finish().await;
}

/// When the catalog last saw node `i`'s lease renewed (`renewed_at`, Unix seconds).
async fn renewed_at(cluster: &Cluster, i: usize) -> f64 {
    postgres::raw(&cluster.db)
        .await
        .query_one(
            "SELECT extract(epoch from renewed_at)::float8 FROM kb_nodes WHERE name = $1",
            &[&cluster.nodes[i].name],
        )
        .await
        .expect("renewed_at")
        .get(0)
}
