//! The command line: `kernelbox cp` both ways, `kernelbox exec --upload/--download`.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::common;
use crate::http::{Served, Session};
use crate::{output, random_bytes, TOKEN};

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
