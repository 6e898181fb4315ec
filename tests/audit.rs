//! The audit trail over real HTTP against the real engine (`docs/usage.md`, "Audit trail"): a
//! `kernelbox serve` with a tenants file auditing one tenant with its code, one with hashes
//! only, and one not at all writes one line per cell and per command of the audited tenants,
//! with the code's SHA-256, the code only where asked, never the output; every line chains to
//! the one before, across a restart; `kernelbox audit verify` passes the trail and names the
//! line after an edited one.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use std::path::Path;
use std::time::Duration;

use hyper::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use http::{tenant, Api};

const CODED: &str = "tok-audit-coded";
const HASHED: &str = "tok-audit-hashed";
const QUIET: &str = "tok-audit-quiet";

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `kernelbox serve` with the tenants file and audit file in `dir`; its address.
async fn serve(dir: &Path, label: &str) -> (tokio::process::Child, Api) {
    serve_with(dir, label, &[]).await
}

/// [`serve`] with more arguments.
async fn serve_with(dir: &Path, label: &str, args: &[&str]) -> (tokio::process::Child, Api) {
    let mut cmd = common::serve_command(label, "unused");
    cmd.arg("--tenants")
        .arg(dir.join("tenants.json"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--audit-file")
        .arg(dir.join("trail.log"))
        .args(["--pool", "0"])
        .args(args)
        .env_remove("KERNELBOX_STATE_DIR");
    let (child, addr) = common::spawn_serving(cmd).await;
    (child, Api::new(addr))
}

/// `kernelbox audit verify FILE`: its exit code, stdout and stderr.
fn verify(file: &Path) -> (i32, String, String) {
    verify_files(&[file.to_path_buf()])
}

/// `kernelbox audit verify FILES...` (oldest first, those that exist).
fn verify_files(files: &[std::path::PathBuf]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
        .args(["audit", "verify"])
        .args(files.iter().filter(|f| f.exists()))
        .output()
        .expect("run kernelbox audit verify");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// The trail's lines, and each parsed.
fn read_trail(file: &Path) -> (Vec<String>, Vec<Value>) {
    let text = std::fs::read_to_string(file).expect("the audit file");
    assert!(text.ends_with('\n'), "{text}");
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    let parsed = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (lines, parsed)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_trail_has_one_chained_line_per_audited_cell_and_command_and_never_the_output() {
    let label = common::unique("audit");
    let engine = common::engine().await;
    let dir = tempfile::tempdir().expect("dir");
    let mut coded = tenant("coded", CODED);
    coded["audit"] = json!({"code": true});
    let mut hashed = tenant("hashed", HASHED);
    hashed["audit"] = json!(true);
    let tenants = json!({"tenants": [coded, hashed, tenant("quiet", QUIET)]});
    std::fs::write(dir.path().join("tenants.json"), tenants.to_string()).unwrap();
    let trail = dir.path().join("trail.log");

    let (mut server, api) = serve(dir.path(), &label).await;
    // What each cell prints is computed, so it is not in its code: the output never lands.
    let printing = "print('OUT' + 'PUT-' + str(6 * 7))";
    let first = api.run(CODED, "work", printing).await;
    assert_eq!(first["output"], "OUTPUT-42\n");
    let failing = "raise ValueError('RAISED-' + str(6 * 7))";
    let failed = api
        .execute(CODED, "work", json!({"code": failing}))
        .await
        .json();
    assert_eq!(failed["status"], "error", "{failed}");
    let command = api
        .post(
            "/v1/sessions/work/commands",
            Some(CODED),
            json!({"command": ["sh", "-c", "echo SECRET-$((6 * 7)); exit 3"]}),
        )
        .await;
    assert_eq!(command.status, StatusCode::OK, "{}", command.json());
    assert_eq!(command.json()["stdout"], "SECRET-42\n");
    let secret_code = "marker = 'hashed-tenant-code'";
    let hashed_run = api.run(HASHED, "other", secret_code).await;
    api.run(QUIET, "unaudited", "quiet = 'quiet-tenant-code'")
        .await;
    // SIGTERM: the server writes what was recorded before it exits.
    let status = common::terminate(&mut server, Duration::from_secs(60)).await;
    assert!(status.success(), "{status}");

    let (lines, records) = read_trail(&trail);
    assert_eq!(lines.len(), 4, "{lines:#?}");
    let text = lines.join("\n");
    for never in [
        "OUTPUT-42",
        "RAISED-42",
        "SECRET-42",
        "hashed-tenant-code",
        "quiet",
    ] {
        assert!(!text.contains(never), "{never} is in the trail: {text}");
    }
    let kinds: Vec<(&str, &str, &str, &str)> = records
        .iter()
        .map(|r| {
            (
                r["kind"].as_str().unwrap(),
                r["tenant"].as_str().unwrap(),
                r["session"].as_str().unwrap(),
                r["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("cell", "coded", "work", "success"),
            ("cell", "coded", "work", "error"),
            ("command", "coded", "work", "error"),
            ("cell", "hashed", "other", "success"),
        ]
    );
    assert_eq!(records[0]["code"], printing);
    assert_eq!(records[0]["code_sha256"], sha256(printing.as_bytes()));
    assert_eq!(records[0]["kernel"], first["kernel"]["id"]);
    assert_eq!(records[0]["generation"], first["kernel"]["generation"]);
    assert!(records[0]["duration_seconds"].as_f64().unwrap() > 0.0);
    assert_eq!(records[1]["code_sha256"], sha256(failing.as_bytes()));
    // A command's code is its arguments joined by NUL.
    let argv = "sh\0-c\0echo SECRET-$((6 * 7)); exit 3";
    assert_eq!(records[2]["code_sha256"], sha256(argv.as_bytes()));
    assert_eq!(records[2]["exit_code"], 3);
    assert_eq!(records[2]["kernel"], first["kernel"]["id"]);
    assert_eq!(records[3]["code_sha256"], sha256(secret_code.as_bytes()));
    assert!(records[3].get("code").is_none(), "{}", lines[3]);
    assert_eq!(records[3]["kernel"], hashed_run["kernel"]["id"]);
    // The chain: each line's prev is the hash of the line before.
    assert_eq!(records[0]["prev"], "0".repeat(64));
    for i in 1..lines.len() {
        assert_eq!(
            records[i]["prev"],
            sha256(lines[i - 1].as_bytes()),
            "line {i}"
        );
    }
    let (code, out, err) = verify(&trail);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("intact: 4 lines"), "{out}");

    // A restart continues the chain from the file's last line.
    let (mut server, api) = serve(dir.path(), &label).await;
    api.run(CODED, "work", "after = 'restart'").await;
    let status = common::terminate(&mut server, Duration::from_secs(60)).await;
    assert!(status.success(), "{status}");
    let (lines, records) = read_trail(&trail);
    assert_eq!(lines.len(), 5, "{lines:#?}");
    assert_eq!(records[4]["prev"], sha256(lines[3].as_bytes()));
    assert_eq!(records[4]["code"], "after = 'restart'");
    let (code, out, err) = verify(&trail);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("intact: 5 lines"), "{out}");

    // An edited line breaks the chain at the next one, and verify names it.
    let edited = std::fs::read_to_string(&trail).unwrap().replacen(
        "\"status\":\"error\"",
        "\"status\":\"success\"",
        1,
    );
    std::fs::write(&trail, edited).unwrap();
    let (code, out, err) = verify(&trail);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("line 3"), "{err}");
    common::assert_clean(&engine, &label).await;
}

/// A metric's value in `text` (a series with exactly this name and labels).
fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in the metrics"))
}

/// The trail's whole lines once one holds the code `code` (the writer writes after the cell's
/// answer); panics naming what the trail holds if none does within 30 s.
async fn written_until(files: &[std::path::PathBuf], code: &str) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let records: Vec<Value> = files
            .iter()
            .filter_map(|f| std::fs::read_to_string(f).ok())
            .flat_map(|text| {
                // Whole lines only: the writer may be mid-line.
                let whole = text.rfind('\n').map_or("", |end| &text[..end]).to_string();
                whole
                    .lines()
                    .map(|l| serde_json::from_str::<Value>(l).unwrap())
                    .collect::<Vec<_>>()
            })
            .collect();
        if records.iter().any(|r| r["code"] == code) {
            return records;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no line of {code:?} in the trail: {:?}",
            records
                .iter()
                .map(|r| (r["tenant"].clone(), r["code"].as_str().map(|c| c.len())))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every line of the trail's files (oldest first), parsed.
fn read_all(files: &[std::path::PathBuf]) -> Vec<Value> {
    files
        .iter()
        .filter(|f| f.exists())
        .flat_map(|f| read_trail(f).1)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_flooding_large_code_cannot_rotate_another_tenants_lines_out() {
    const HONEST: &str = "tok-audit-honest";
    const FLOODS: [(&str, &str); 3] = [
        ("hostile", "tok-audit-hostile"),
        ("hostile2", "tok-audit-hostile2"),
        ("hostile3", "tok-audit-hostile3"),
    ];
    /// Cells each flooding tenant runs: past its budget of one file (256 KiB) of lines.
    const CELLS: usize = 20;
    let label = common::unique("audit-flood");
    let engine = common::engine().await;
    let dir = tempfile::tempdir().expect("dir");
    let mut entries = vec![tenant("honest", HONEST)];
    for (name, token) in FLOODS {
        entries.push(tenant(name, token));
    }
    for entry in &mut entries {
        entry["audit"] = json!({"code": true});
    }
    std::fs::write(
        dir.path().join("tenants.json"),
        json!({ "tenants": entries }).to_string(),
    )
    .unwrap();
    let trail = dir.path().join("trail.log");
    let files = [dir.path().join("trail.log.1"), trail.clone()];
    let (mut server, api) = serve_with(
        dir.path(),
        &label,
        &["--audit-rotate", "256k", "--audit-keep", "1"],
    )
    .await;

    api.run(HONEST, "honest", "honest = 1").await;
    api.run(HONEST, "honest", "honest = 2").await;
    // A 0.9 MiB comment per cell: before the per-line cap and the tenant budget, each such
    // line was a file of its own and three of them rotated every other line out.
    let big = format!("#{}\nflood = 1", "x".repeat(900 * 1024));
    for _ in 0..CELLS {
        api.run(FLOODS[0].1, "flood", &big).await;
    }
    api.run(HONEST, "honest", "honest = 3").await;
    // Lines are written in order: once the last is in, so is (or was dropped) every one before.
    let records = written_until(&files, "honest = 3").await;
    let honest: Vec<&str> = records
        .iter()
        .filter(|r| r["tenant"] == "honest")
        .map(|r| r["code"].as_str().unwrap())
        .collect();
    assert_eq!(honest, ["honest = 1", "honest = 2", "honest = 3"]);
    let text = api.metrics(HONEST).await;
    let dropped = metric(
        &text,
        "kernelbox_audit_dropped_total{reason=\"tenant_budget\"}",
    );
    assert!(dropped >= 1, "{dropped}");
    assert!(metric(&text, "kernelbox_audit_code_truncated_total") >= CELLS as u64);
    assert_eq!(metric(&text, "kernelbox_audit_rotated_out_files_total"), 0);

    let flood: Vec<&Value> = records
        .iter()
        .filter(|r| r["tenant"] == "hostile")
        .collect();
    println!(
        "flood of {CELLS} cells of {} bytes: {} lines kept (the longest {} bytes), {dropped} \
         dropped",
        big.len(),
        flood.len(),
        flood.iter().map(|r| r.to_string().len()).max().unwrap_or(0)
    );
    // Its last dropped record is kept, to be written at the end of its hour or at SIGTERM
    // (below): not counted as dropped.
    assert_eq!(flood.len() as u64 + dropped + 1, CELLS as u64);
    for line in &flood {
        // The line keeps the code's first bytes, marked, and the whole code's hash.
        assert_eq!(line["code"].as_str().unwrap().len(), 16 * 1024);
        assert_eq!(line["code_truncated"], true);
        assert_eq!(line["code_bytes"], big.len());
        assert_eq!(line["code_sha256"], sha256(big.as_bytes()));
    }
    let (code, out, err) = verify_files(&files);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("chained from the trail's start"), "{out}");
    let first = records[0]["time"].as_str().unwrap();
    assert!(out.contains(&format!("first line: {first}")), "{out}");

    // The budget is per tenant: two more flooding tenants do rotate the oldest file out
    // (`--audit-keep 1`), and that is visible: counted at /metrics, and verify says where the
    // trail now starts, chained from a line it no longer has.
    for (_, token) in &FLOODS[1..] {
        for _ in 0..CELLS {
            api.run(token, "flood", &big).await;
        }
    }
    api.run(HONEST, "honest", "honest = 4").await;
    written_until(&files, "honest = 4").await;
    let text = api.metrics(HONEST).await;
    assert!(metric(&text, "kernelbox_audit_rotated_out_files_total") >= 1);
    assert!(metric(&text, "kernelbox_audit_rotated_out_bytes_total") >= 200 * 1024);
    let status = common::terminate(&mut server, Duration::from_secs(60)).await;
    assert!(status.success(), "{status}");
    let records = read_all(&files);
    // None of the flooding tenants wrote again: at SIGTERM each one's last record is written,
    // saying how many of its records were dropped before it, so the gap is in the trail.
    for (name, _) in FLOODS {
        let last = records
            .iter()
            .rev()
            .find(|r| r["tenant"] == name)
            .unwrap_or_else(|| panic!("no line of {name}"));
        assert!(
            last["tenant_dropped"].as_u64().unwrap_or(0) >= 1,
            "{name}: {last}"
        );
    }
    let (code, out, err) = verify_files(&files);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("chained from a line before these files"),
        "{out}"
    );
    let now_first = records[0]["time"].as_str().unwrap();
    assert!(now_first > first, "{now_first} {first}");
    assert!(out.contains(&format!("first line: {now_first}")), "{out}");
    common::assert_clean(&engine, &label).await;
}
