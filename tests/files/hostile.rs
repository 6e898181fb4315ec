//! Cells that attack their kernel's helper: kill it, forge its frames, stop it and drip on its
//! stderr; each fails at most that one transfer, bounded, and the next works.

use hyper::StatusCode;

use crate::common::{memory_of, MIB};
use crate::http::{files, Served, Session};
use crate::{forge, helpers_settle, output, random_bytes, server, TOKEN};

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

/// A cell stops its resident helper (SIGSTOP) and drips a byte into its stderr every 5 s for
/// 150 s: the next transfer, which gets no frame, still ends at its step deadline
/// (`FILE_IDLE_TIMEOUT`, docs/files.md "Files in and out of a kernel"), not when the drip stops.
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
