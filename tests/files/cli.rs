//! The command line: `kernelbox cp` both ways, `kernelbox exec --upload/--download`, and
//! `kernelbox exec --url`; the exit codes of a call to a server (`docs/cli.md`).

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::common;
use crate::http::{Served, Session};
use crate::{output, random_bytes, server, TOKEN};

/// Runs the binary with `args` in `dir`: its exit code, standard output and standard error.
fn kernelbox(dir: &std::path::Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
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
async fn exec_url_runs_on_the_server_and_its_exit_code_says_what_failed() {
    let srv = server("files-exec-url", |_| {}).await;
    let dir = tempfile::tempdir().unwrap();
    let base = srv.api.base.clone();
    let exec = |token: &str, session: &str, code: &str| {
        kernelbox(
            dir.path(),
            &[
                "exec",
                "--url",
                &base,
                "--token",
                token,
                "--session",
                session,
                code,
            ],
        )
    };
    let (code, _, stderr) = exec(TOKEN, "eu", "x = 41");
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stdout, stderr) = exec(TOKEN, "eu", "print(x + 1)");
    assert_eq!(code, Some(0), "{stderr}");
    let result: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(output(&result), "42", "{result}");
    let (code, stdout, _) = exec(TOKEN, "eu", "1/0");
    assert_eq!(code, Some(1));
    let result: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(result["status"], "error", "{result}");
    // A name the server refuses reaches it encoded (a space, `/`) and is refused as such.
    for session in ["e u", "e/u"] {
        let (code, _, stderr) = exec(TOKEN, session, "1");
        assert_eq!(code, Some(2), "{stderr}");
        assert!(
            stderr.contains("server answered 400 Bad Request"),
            "{stderr}"
        );
    }
    let (code, _, stderr) = exec("wrong", "eu", "1");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("server answered 401 Unauthorized"),
        "{stderr}"
    );
    let (code, _, stderr) = kernelbox(
        dir.path(),
        &[
            "exec",
            "--url",
            "http://127.0.0.1:1",
            "--session",
            "eu",
            "1",
        ],
    );
    assert_eq!(code, Some(3), "{stderr}");
    assert!(
        stderr.contains("cannot reach the kernelbox server"),
        "{stderr}"
    );
    srv.finish().await;
}

/// A server that answers every request `200` with `content_type` and a body it cuts short:
/// its base URL.
async fn cutting_server(content_type: &'static str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match socket.read(&mut buf).await {
                    Ok(n) if n > 0 => head.extend_from_slice(&buf[..n]),
                    _ => break,
                }
            }
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\n\
                 content-length: 100000\r\n\r\n0123456789"
            );
            let _ = socket.write_all(answer.as_bytes()).await;
        }
    });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread")]
async fn cp_reports_a_download_that_breaks_off_as_a_transport_failure() {
    let dir = tempfile::tempdir().unwrap();
    for (content_type, local) in [
        ("application/octet-stream", "file.bin"),
        ("application/x-tar", "dir"),
    ] {
        let base = cutting_server(content_type).await;
        let (code, _, stderr) = kernelbox(dir.path(), &["cp", "s:x", local, "--url", &base]);
        assert_eq!(code, Some(3), "{content_type}: {stderr}");
        assert!(
            stderr.contains("reading the server's answer"),
            "{content_type}: {stderr}"
        );
        assert!(!stderr.contains("file helper"), "{content_type}: {stderr}");
    }
    // Nothing half-written is left of the file.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("dir")]);
}
