//! The file channel (docs/files.md "Files in and out of a kernel"): transfers over the helper's
//! socket, a helper kept from its channel, and the exec streams when the socket is out of
//! reach.

use std::time::Duration;

use hyper::StatusCode;

use crate::http::{Served, Session};
use crate::{forge, output, random_bytes, TOKEN};

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
