//! Admin verbs work from Docker labels alone, with no server: ps, inspect, logs, kill, sweep.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{Case, CASE};
use serde_json::Value;

/// Serializes the tests of this file (see the sweep test).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn kernelbox(args: &[&str]) -> (i32, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
        .args(args)
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code().unwrap_or(-1), text)
}

#[tokio::test]
async fn ps_inspect_logs_and_kill_work_from_labels() {
    let _serial = SERIAL.lock().await;
    let case = Case::new("admin").await;
    let tenant = format!("t{}", &case.label[case.label.len() - 8..]);
    let r = case
        .exec(kernelbox::ExecuteRequest::new(
            kernelbox::Scope::session("admin-s").tenant(tenant.clone()),
            "x = 1",
        ))
        .await;
    let id = r.kernel.id.clone();

    let (code, out) = kernelbox(&["ps", "--tenant", &tenant, "--format", "json"]).await;
    assert_eq!(code, 0);
    let rows: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(rows.len(), 1, "{out}");
    assert_eq!(rows[0]["container"], id.as_str());
    assert_eq!(rows[0]["owner"], "admin-s");
    assert_eq!(rows[0]["cells"], 1);
    assert_eq!(rows[0]["busy"], false);
    assert!(rows[0]["idle_seconds"].is_u64());
    assert!(
        rows[0]["memory_bytes"].as_u64().unwrap_or(0) > 1 << 20,
        "{out}"
    );

    // The server that runs it: its instance id (as its `serving` line says it) and pid.
    let instance = case.kb.instance_id().to_string();
    assert_eq!(rows[0]["server"], &instance[..12], "{out}");
    assert_eq!(
        rows[0]["server_pid"],
        std::process::id().to_string(),
        "{out}"
    );

    let (code, table) = kernelbox(&["ps", "--tenant", &tenant]).await;
    assert_eq!(code, 0);
    assert!(
        table.starts_with("CONTAINER  ") && table.contains(&id),
        "{table}"
    );
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header[1], "SERVER", "{table}");
    let line: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(line[1], &instance[..12], "{table}");

    // --server: by instance id prefix or by pid; another server's is not listed.
    let pid = std::process::id().to_string();
    for server in [&instance[..8], pid.as_str()] {
        let (code, out) = kernelbox(&[
            "ps", "--tenant", &tenant, "--server", server, "--format", "json",
        ])
        .await;
        assert_eq!(code, 0);
        let rows: Vec<Value> = serde_json::from_str(&out).unwrap();
        assert_eq!(rows.len(), 1, "--server {server}: {out}");
    }
    for server in ["ffffffff", "4294967295"] {
        let (code, out) = kernelbox(&[
            "ps", "--tenant", &tenant, "--server", server, "--format", "json",
        ])
        .await;
        assert_eq!(code, 0);
        assert_eq!(out.trim(), "[]", "--server {server}");
    }

    let (code, out) = kernelbox(&["inspect", &id]).await;
    assert_eq!(code, 0);
    let inspected: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(inspected["labels"]["io.kernelbox.tenant"], tenant.as_str());

    let (code, out) = kernelbox(&["logs", &id]).await;
    assert_eq!(code, 0);
    assert!(out.contains("create") && out.contains("start"), "{out}");

    // --server-log: the server's lifecycle events for this kernel, from its log in either
    // format (lines as `kernelbox serve` writes them, docs/logs.md), nothing of another's.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let other = "0123456789ab";
    std::fs::write(
        &log,
        format!(
            "2026-12-07T20:00:00.000001Z  INFO request{{request_id=5f0c2a8e9b1d4e7f8a6b3c2d1e0f9a8b}}: kernelbox::lifecycle: kernel started event=\"started\" tenant={tenant} session=admin-s owner=admin-s container=\"{id}\" generation=1 how=\"cold\"\n\
             2026-12-07T20:00:00.000002Z  INFO kernelbox::lifecycle: kernel started event=\"started\" tenant={tenant} session=b owner=b container=\"{other}\" generation=1 how=\"cold\"\n\
             2026-12-07T20:00:00.000003Z  INFO kernelbox::access: request container={id}\n\
             {{\"timestamp\":\"2026-12-07T20:00:01Z\",\"level\":\"INFO\",\"target\":\"kernelbox::lifecycle\",\"event\":\"lost\",\"container\":\"{id}\",\"reason\":\"killed\",\"message\":\"kernel lost\"}}\n\
             {{\"timestamp\":\"2026-12-07T20:00:01Z\",\"level\":\"INFO\",\"target\":\"kernelbox::lifecycle\",\"event\":\"lost\",\"container\":\"{other}\",\"reason\":\"killed\",\"message\":\"kernel lost\"}}\n"
        ),
    )
    .unwrap();
    let (code, out) = kernelbox(&["logs", &id, "--server-log", log.to_str().unwrap()]).await;
    assert_eq!(code, 0);
    let (engine, server) = out.split_once("# the server's lifecycle events").unwrap();
    assert!(engine.contains("create"), "{out}");
    let server: Vec<&str> = server.lines().skip(1).collect();
    assert_eq!(server.len(), 2, "{out}");
    assert!(
        server[0].contains("kernel started") && server[0].contains(&id),
        "{out}"
    );
    assert!(server[1].contains("\"reason\":\"killed\""), "{out}");
    assert!(
        !out.contains(other) && !out.contains("kernelbox::access"),
        "{out}"
    );

    let (code, out) = kernelbox(&["kill", "--tenant", &tenant, "--format", "json"]).await;
    assert_eq!(code, 0);
    let killed: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(killed.len(), 1);
    assert!(case.containers().await.is_empty());
    assert!(
        case.volumes().await.is_empty(),
        "kill takes the staging volume too"
    );
    // The orchestrator notices on the next call and says why.
    let next = case
        .exec(kernelbox::ExecuteRequest::new(
            kernelbox::Scope::session("admin-s").tenant(tenant.clone()),
            "print('x' in dir())",
        ))
        .await;
    assert!(next.output.contains("False"));
    assert_eq!(
        next.kernel.state_lost.as_ref().map(|l| l.reason),
        Some(kernelbox::LossReason::Killed)
    );
    case.finish().await;
}

/// A leftover of a dead instance (a created container and its volume, labelled with a pid that
/// no longer runs) and a week-old staging volume of a live instance: `kernelbox sweep
/// --dry-run` reports both and removes nothing; `kernelbox sweep` removes both; a fresh
/// staging volume of the live instance stays throughout.
#[tokio::test]
async fn sweep_dry_run_reports_without_removing() {
    // Every orchestrator start sweeps dead instances' leftovers: the other test here must not
    // start one while this one looks at its leftover.
    let _serial = SERIAL.lock().await;
    let label = common::unique("sweep");
    let engine = common::engine().await;
    let case = BTreeMap::from([(CASE.to_string(), label.clone())]);
    let now = kernelbox::clock::unix_now();
    let me = kernelbox::instance::Instance::current();
    let dead = kernelbox::instance::Instance {
        id: format!("dead-{label}"),
        pid: u32::MAX - 1,
        ..me.clone()
    };
    let live = kernelbox::instance::Instance {
        id: format!("live-{label}"),
        ..me
    };
    let staging = |instance: &kernelbox::instance::Instance, created: u64| {
        let mut labels = instance.labels(&case);
        labels.insert("io.kernelbox.role".into(), "staging".into());
        labels.insert("io.kernelbox.created-at".into(), created.to_string());
        labels
    };
    let dead_labels = staging(&dead, now);
    let volumes = [
        (format!("{label}-dead"), dead_labels.clone()),
        (format!("{label}-stale"), staging(&live, now - 8 * 86400)),
        (format!("{label}-fresh"), staging(&live, now)),
    ];
    for (name, labels) in &volumes {
        engine
            .create_volume(name, labels, None)
            .await
            .expect("create volume");
    }
    let spec = kernelbox::docker::ContainerSpec {
        image: kernelbox::config::DEFAULT_IMAGE.into(),
        cmd: vec!["python3".into(), "-c".into(), "pass".into()],
        env: vec![],
        user: "10000:10000".into(),
        working_dir: "/".into(),
        labels: dead_labels,
        mounts: vec![],
        sandbox: kernelbox::Sandbox::default(),
    };
    let container = engine.create_container(&spec).await.expect("container");
    let names = |range: std::ops::Range<usize>| -> BTreeSet<String> {
        volumes[range].iter().map(|(n, _)| n.clone()).collect()
    };
    let present = || async {
        let containers: Vec<String> = common::containers(&engine, &label)
            .await
            .into_iter()
            .map(|c| c.id)
            .collect();
        let volumes: BTreeSet<String> = common::volumes(&engine, &label)
            .await
            .into_iter()
            .map(|v| v.name)
            .collect();
        (containers, volumes)
    };
    let reported = |report: &Value| {
        let containers: Vec<String> = report["containers"]
            .as_array()
            .expect("containers")
            .iter()
            .filter_map(|c| c.as_str())
            .filter(|c| container.starts_with(c) || c.starts_with(container.as_str()))
            .map(String::from)
            .collect();
        let volumes: BTreeSet<String> = report["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .filter_map(|v| v.as_str())
            .filter(|v| v.starts_with(&label))
            .map(String::from)
            .collect();
        (containers.len(), volumes)
    };

    let (code, out) = kernelbox(&["sweep", "--dry-run", "--format", "json"]).await;
    assert_eq!(code, 0, "{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(reported(&report), (1, names(0..2)), "{report}");
    assert_eq!(
        present().await,
        (vec![container.clone()], names(0..3)),
        "a dry run removes nothing"
    );

    let (code, out) = kernelbox(&["sweep", "--format", "json"]).await;
    assert_eq!(code, 0, "{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(reported(&report), (1, names(0..2)), "{report}");
    assert_eq!(
        present().await,
        (vec![], names(2..3)),
        "the sweep removed both leftovers and kept the fresh volume"
    );
    engine
        .remove_volume(&volumes[2].0)
        .await
        .expect("remove the fresh volume");
    common::assert_clean(&engine, &label).await;

    let (code, _) = kernelbox(&["kill"]).await;
    assert_eq!(code, 2, "kill needs a target");
}

/// docs/runtimes.md, "Across a restart of the server": hibernated kernels' stopped containers
/// (`kbh.<since>...`) of a state directory that never comes back. `kernelbox sweep` lists each
/// with why it keeps or removes it; one past the spare time (7 d) goes with its volume
/// whoever made it, a live server's included (today's rule, by the maker's liveness, keeps
/// it); with `--hibernated-max-age 1h` one of 2 h goes
/// too when no live server uses its directory, and one whose directory a live server uses is
/// kept. Each is made through the Docker API: created, run to exit, renamed.
#[tokio::test]
async fn sweep_removes_hibernated_kernels_past_their_age_with_their_volumes() {
    let _serial = SERIAL.lock().await;
    let label = common::unique("sweep-kbh");
    let engine = common::engine().await;
    let case = BTreeMap::from([(CASE.to_string(), label.clone())]);
    let now = kernelbox::clock::unix_now();
    let me = kernelbox::instance::Instance::current();
    let dead = kernelbox::instance::Instance {
        id: format!("dead-{label}"),
        pid: u32::MAX - 1,
        ..me.clone()
    };
    // This test's process stands for a live server: its pid runs.
    let live = kernelbox::instance::Instance {
        id: format!("live-{label}"),
        ..me
    };
    let spare = kernelbox::config::HIBERNATED_SPARED_FOR.as_secs();
    // (what, its maker, its directory's tag, hibernated this long ago)
    // The old one is a live server's: no sweep of today's rules (by the maker's liveness)
    // would take it, nor another test's server starting meanwhile.
    let kernels = [
        ("ancient", &live, "live-dir", spare + 60),
        ("recent-gone", &dead, "gone-dir", 7200),
        ("recent-live", &live, "live-dir", 7200),
    ];
    let mut made = Vec::new();
    for (what, maker, dir, age) in &kernels {
        let volume = format!("{label}-{what}");
        let mut labels = maker.labels(&case);
        labels.insert("io.kernelbox.checkpoints".into(), format!("{label}-{dir}"));
        engine
            .create_volume(&volume, &labels, None)
            .await
            .expect("create volume");
        labels.insert("io.kernelbox.volume".into(), volume.clone());
        let spec = kernelbox::docker::ContainerSpec {
            image: kernelbox::config::DEFAULT_IMAGE.into(),
            cmd: vec!["python3".into(), "-c".into(), "pass".into()],
            env: vec![],
            user: "10000:10000".into(),
            working_dir: "/".into(),
            labels,
            mounts: vec![kernelbox::docker::Mount::Volume {
                name: volume.clone(),
                target: "/work".into(),
            }],
            sandbox: kernelbox::Sandbox {
                keep_stopped: true,
                ..kernelbox::Sandbox::default()
            },
        };
        let id = engine.create_container(&spec).await.expect("container");
        engine.start(&id).await.expect("start");
        let name = kernelbox::labels::hibernated_name(
            now - age,
            "t",
            what,
            kernelbox::docker::short_id(&id),
        );
        engine.rename_container(&id, &name).await.expect("rename");
        made.push((id, volume));
    }
    // Each has run to its end: stopped, as a hibernated kernel's container is.
    for _ in 0..600 {
        let exited = common::containers(&engine, &label)
            .await
            .iter()
            .filter(|c| c.state == "exited")
            .count();
        if exited == made.len() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let present = || async {
        let containers: BTreeSet<String> = common::containers(&engine, &label)
            .await
            .into_iter()
            .filter(|c| c.state == "exited")
            .map(|c| c.id)
            .collect();
        let volumes: BTreeSet<String> = common::volumes(&engine, &label)
            .await
            .into_iter()
            .map(|v| v.name)
            .collect();
        (containers, volumes)
    };
    let all = || {
        (
            made.iter().map(|(c, _)| c.clone()).collect::<BTreeSet<_>>(),
            made.iter().map(|(_, v)| v.clone()).collect::<BTreeSet<_>>(),
        )
    };
    assert_eq!(present().await, all(), "three stopped hibernated kernels");
    // This test's kernels in a report: (index, removed, why).
    let judged = |report: &Value| -> Vec<(usize, bool, String)> {
        let mut rows: Vec<(usize, bool, String)> = report["hibernated"]
            .as_array()
            .unwrap_or_else(|| panic!("no hibernated list: {report}"))
            .iter()
            .filter_map(|h| {
                let i = made
                    .iter()
                    .position(|(c, _)| h["container"].as_str() == Some(c))?;
                Some((
                    i,
                    h["removed"].as_bool().unwrap(),
                    h["why"].as_str().unwrap().to_string(),
                ))
            })
            .collect();
        rows.sort();
        rows
    };

    // The defaults (max age 7 d): only those past the spare time go; a dry run removes nothing.
    let (code, out) = kernelbox(&["sweep", "--dry-run", "--format", "json"]).await;
    assert_eq!(code, 0, "{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let past = "past the spare time".to_string();
    let within = "within the max age".to_string();
    assert_eq!(
        judged(&report),
        vec![
            (0, true, past.clone()),
            (1, false, within.clone()),
            (2, false, within.clone()),
        ],
        "{report}"
    );
    assert_eq!(present().await, all(), "a dry run removes nothing");

    let (code, out) = kernelbox(&["sweep", "--hibernated-max-age", "8d"]).await;
    assert_eq!(code, 2, "past the spare time is refused: {out}");
    assert_eq!(present().await, all(), "a refused sweep removes nothing");

    let (code, out) = kernelbox(&["sweep", "--hibernated-max-age", "1h", "--format", "json"]).await;
    assert_eq!(code, 0, "{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        judged(&report),
        vec![
            (0, true, past),
            (
                1,
                true,
                "past the max age, no live server on its directory".into()
            ),
            (2, false, "a live server uses its directory".into()),
        ],
        "{report}"
    );
    let removed_volumes: BTreeSet<String> = report["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .filter(|v| v.starts_with(&label))
        .map(String::from)
        .collect();
    assert_eq!(
        removed_volumes,
        made[..2].iter().map(|(_, v)| v.clone()).collect(),
        "{report}"
    );
    assert_eq!(
        present().await,
        (
            BTreeSet::from([made[2].0.clone()]),
            BTreeSet::from([made[2].1.clone()])
        ),
        "two removed with their volumes, the live server's recent one kept"
    );
    engine.remove_container(&made[2].0).await.expect("remove");
    kernelbox::docker::remove_volume_when_free(engine.as_ref(), &made[2].1)
        .await
        .expect("remove the volume");
    common::assert_clean(&engine, &label).await;
}

/// docs/runtimes.md, "Across a restart of the server": a live hibernating server running no
/// container (no pool, its kernels all hibernated) still uses its checkpoints directory, and its
/// watchdog names it: `kernelbox sweep --hibernated-max-age 1h` keeps that directory's
/// hibernated kernel of 2 h (a restore would find it); once the server has stopped, the
/// same sweep removes it with its volume.
#[tokio::test]
async fn sweep_keeps_the_hibernated_kernels_of_a_live_server_running_no_container() {
    use tokio::io::AsyncBufReadExt;
    let _serial = SERIAL.lock().await;
    let label = common::unique("sweep-kbh-idle");
    let engine = common::engine().await;
    let state = tempfile::tempdir().expect("state dir");
    let state_dir = std::fs::canonicalize(state.path()).expect("canonical");
    let mut server = common::serve_command(&label, "sweep-idle-token")
        .args([
            "--pool",
            "0",
            "--runtime",
            "runsc",
            "--hibernate",
            "--state-dir",
        ])
        .arg(&state_dir)
        .env_remove("KERNELBOX_STATE_DIR")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("kernelbox serve");
    let mut lines = tokio::io::BufReader::new(server.stderr.take().expect("stderr")).lines();
    common::serving_addr(&mut lines).await;
    let drain = tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    // A hibernated kernel of its directory, made after its start (a start discards the
    // directory's containers no record claims), by an earlier server now dead.
    let tag = kernelbox::labels::checkpoints_tag(&state_dir.join("checkpoints"));
    let me = kernelbox::instance::Instance::current();
    let dead = kernelbox::instance::Instance {
        id: format!("dead-{label}"),
        pid: u32::MAX - 1,
        ..me
    };
    let volume = format!("{label}-idle");
    let mut labels = dead.labels(&BTreeMap::from([(CASE.to_string(), label.clone())]));
    labels.insert("io.kernelbox.checkpoints".into(), tag);
    engine
        .create_volume(&volume, &labels, None)
        .await
        .expect("create volume");
    labels.insert("io.kernelbox.volume".into(), volume.clone());
    let spec = kernelbox::docker::ContainerSpec {
        image: kernelbox::config::DEFAULT_IMAGE.into(),
        cmd: vec!["python3".into(), "-c".into(), "pass".into()],
        env: vec![],
        user: "10000:10000".into(),
        working_dir: "/".into(),
        labels,
        mounts: vec![kernelbox::docker::Mount::Volume {
            name: volume.clone(),
            target: "/work".into(),
        }],
        sandbox: kernelbox::Sandbox {
            keep_stopped: true,
            ..kernelbox::Sandbox::default()
        },
    };
    let id = engine.create_container(&spec).await.expect("container");
    engine.start(&id).await.expect("start");
    let name = kernelbox::labels::hibernated_name(
        kernelbox::clock::unix_now() - 7200,
        "t",
        "idle",
        kernelbox::docker::short_id(&id),
    );
    engine.rename_container(&id, &name).await.expect("rename");
    for _ in 0..600 {
        if common::containers(&engine, &label)
            .await
            .iter()
            .any(|c| c.id == id && c.state == "exited")
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let judged = |out: &str| -> (bool, String) {
        let report: Value = serde_json::from_str(out).unwrap();
        let row = report["hibernated"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["container"].as_str() == Some(&id))
            .unwrap_or_else(|| panic!("the hibernated kernel is not listed: {report}"))
            .clone();
        (
            row["removed"].as_bool().unwrap(),
            row["why"].as_str().unwrap().to_string(),
        )
    };

    let (code, out) = kernelbox(&["sweep", "--hibernated-max-age", "1h", "--format", "json"]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        judged(&out),
        (false, "a live server uses its directory".to_string()),
        "{out}"
    );
    assert!(
        common::containers(&engine, &label)
            .await
            .iter()
            .any(|c| c.id == id),
        "kept"
    );

    // Stopped (its watchdog gone with it): the directory is no one's.
    let pid = server.id().expect("pid").to_string();
    let status = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("kill");
    assert!(status.success());
    server.wait().await.expect("the server stops");
    drain.await.expect("stderr drained");
    let (code, out) = kernelbox(&["sweep", "--hibernated-max-age", "1h", "--format", "json"]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        judged(&out),
        (
            true,
            "past the max age, no live server on its directory".to_string()
        ),
        "{out}"
    );
    common::assert_clean(&engine, &label).await;
}
