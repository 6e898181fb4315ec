//! Uploads and downloads end to end: bytes in and out byte for byte, a kernel started by an
//! upload, transfers beside a running cell, deletes, 100 MiB streamed without growing the
//! server, the project directory, and a transfer holding its kernel against the idle reaper.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Frame;
use hyper::header::CONTENT_LENGTH;
use hyper::{Method, StatusCode};
use sha2::{Digest, Sha256};

use crate::common::{memory_of, MIB};
use crate::http::{Served, Session};
use crate::{output, random_bytes, server, TOKEN};

#[tokio::test(flavor = "multi_thread")]
async fn ten_mib_of_random_bytes_upload_start_the_kernel_and_a_cell_hashes_them_equal() {
    let s = server("files-roundtrip", |_| {}).await;
    let rt = Session::new(&s.api, TOKEN, "rt");
    let data = random_bytes(10 * 1024 * 1024);
    let digest = hex::encode(Sha256::digest(&data));
    // No kernel yet: the upload starts one.
    assert!(s.api.kernels(TOKEN).await.is_empty());
    let reply = rt.put("data/in/blob.bin", data.clone()).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    assert_eq!(reply.json()["path"], "/work/data/in/blob.bin");
    assert_eq!(reply.json()["size"], data.len());
    assert_eq!(s.api.kernels(TOKEN).await.len(), 1);

    let result = rt
        .run(
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

    let back = rt.get("data/in/blob.bin").await;
    assert_eq!(back.status, StatusCode::OK);
    assert_eq!(
        back.headers[CONTENT_LENGTH],
        data.len().to_string().as_str()
    );
    assert!(back.body[..] == data[..], "downloaded bytes differ");
    let metrics = s.api.metrics(TOKEN).await;
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
async fn uploads_and_deletes_run_while_a_cell_runs_in_the_same_kernel() {
    let s = server("files-concurrent", |_| {}).await;
    let busy = Session::new(&s.api, TOKEN, "busy");
    busy.run("x = 1").await;
    let mut events = s
        .api
        .stream(
            TOKEN,
            "busy",
            serde_json::json!({"code": concat!(
                "import os, time\nprint('waiting', flush=True)\n",
                "deadline = time.time() + 60\n",
                "while time.time() < deadline and not all(os.path.exists('up%d.bin' % i) for i in range(4)):\n",
                "    time.sleep(0.05)\n",
                "print('saw', sum(os.path.getsize('up%d.bin' % i) for i in range(4)))",
            )}),
        )
        .await;
    events.until_output("waiting").await;
    let uploads = (0..4).map(|i| {
        let busy = &busy;
        async move {
            busy.put(&format!("up{i}.bin"), vec![i as u8; 1024 * 1024])
                .await
        }
    });
    for reply in futures::future::join_all(uploads).await {
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    }
    let result = events.result().await;
    assert_eq!(result["status"], "success", "{result}");
    assert!(output(&result).ends_with("saw 4194304"), "{result}");

    // Delete: a file, then a whole tree; the symlink itself goes, never its target.
    busy.run("import os\nos.makedirs('tree/a/b')\nopen('tree/a/b/f', 'w').write('x')\nos.symlink('/tmp', 'tree/link')\nopen('/tmp/keep', 'w').write('k')")
        .await;
    let reply = busy.delete("up0.bin").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    assert_eq!(reply.json()["deleted"], "/work/up0.bin");
    let reply = busy.delete("tree").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    let reply = busy.delete("tree").await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "not_found");
    let result = busy
        .run("import os\nprint(os.path.exists('up0.bin'), os.path.exists('tree'), open('/tmp/keep').read())")
        .await;
    assert_eq!(output(&result), "False False k", "{result}");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_mib_streams_in_and_out_without_growing_the_server() {
    let served = Served::start("files-stream-memory", TOKEN, &[]).await;
    let (api, pid) = (&served.api, served.process.id().unwrap());
    let mem = Session::new(api, TOKEN, "mem");
    // Warm up: the kernel, the helper path, the allocator's pools.
    let reply = mem.put("warm.bin", vec![1; 4 * 1024 * 1024]).await;
    assert_eq!(reply.status, StatusCode::CREATED);
    let _ = mem.get("warm.bin").await;
    let (rss_before, hwm_before) = memory_of(pid);

    let size = 100 * 1024 * 1024;
    let started = std::time::Instant::now();
    let reply = mem.put_streamed("big.bin", 100, 1024 * 1024).await;
    let upload = started.elapsed();
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    assert_eq!(reply.json()["size"], size);

    let started = std::time::Instant::now();
    let req = api
        .build(Method::GET, &mem.url("big.bin"), Some(TOKEN), false, false)
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let response = api.http.request(req).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut received = 0usize;
    let mut all_z = true;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            all_z &= data.iter().all(|b| *b == b'z');
            received += data.len();
        }
    }
    let download = started.elapsed();
    assert_eq!(received, size);
    assert!(all_z, "downloaded bytes differ");

    let (rss_after, hwm_after) = memory_of(pid);
    let growth = rss_after.saturating_sub(rss_before);
    let peak = hwm_after.saturating_sub(hwm_before);
    eprintln!(
        "100 MiB: upload {:.0} MiB/s, download {:.0} MiB/s; server VmRSS {:.1} -> {:.1} MiB, VmHWM +{:.1} MiB",
        100.0 / upload.as_secs_f64(),
        100.0 / download.as_secs_f64(),
        rss_before as f64 / MIB,
        rss_after as f64 / MIB,
        peak as f64 / MIB,
    );
    assert!(
        peak < 32 * 1024 * 1024,
        "the server's peak grew by {:.1} MiB",
        peak as f64 / MIB
    );
    assert!(
        growth < 32 * 1024 * 1024,
        "the server grew by {:.1} MiB",
        growth as f64 / MIB
    );
    served.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transfer_holds_its_kernel_against_the_idle_reaper_and_touches_its_last_use() {
    let idle = Duration::from_secs(2);
    let s = server("files-reaper", |c| c.kernels.idle_timeout = idle).await;
    let slow = Session::new(&s.api, TOKEN, "slow");
    slow.run("x = 'kept'").await;
    // An upload whose body the test paces: it is in flight for longer than the idle timeout.
    let (tx, upload) = slow.paced_put("slow.bin");
    tx.send(Ok(Frame::data(Bytes::from_static(b"first;"))))
        .await
        .unwrap();
    // Let the idle timeout pass while the transfer is in flight, then make the registry reap
    // (every new attach reaps idle kernels first).
    tokio::time::sleep(idle + Duration::from_millis(500)).await;
    s.api.run(TOKEN, "bystander", "pass").await;
    let kernels = s.api.kernels(TOKEN).await;
    assert!(
        kernels.iter().any(|k| k["session"] == "slow"),
        "reaped mid-transfer: {kernels:?}"
    );
    tx.send(Ok(Frame::data(Bytes::from_static(b"last"))))
        .await
        .unwrap();
    drop(tx);
    let reply = upload.await.unwrap().unwrap();
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    // The transfer touched the kernel's last use: it is not idle since before the upload.
    let kernels = s.api.kernels(TOKEN).await;
    let kernel = kernels
        .iter()
        .find(|k| k["session"] == "slow")
        .expect("the kernel");
    assert!(kernel["idle_seconds"].as_f64().unwrap() < 1.5, "{kernel}");
    let result = slow.run("print(x, open('slow.bin').read())").await;
    assert_eq!(output(&result), "kept first;last", "{result}");
    assert!(result["kernel"]["state_lost"].is_null(), "{result}");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn in_project_mode_files_land_in_the_bind_mounted_project_directory() {
    use std::os::unix::fs::PermissionsExt;
    let project = tempfile::tempdir().unwrap();
    std::fs::set_permissions(project.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(project.path().join("host.txt"), "from the host").unwrap();
    let dir = project.path().to_path_buf();
    let s = server("files-project", |c| {
        c.spec.mode = kernelbox::WorkMode::Project(dir)
    })
    .await;
    let proj = Session::new(&s.api, TOKEN, "proj");
    let reply = proj.put("sub/up.txt", b"uploaded").await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    assert_eq!(reply.json()["path"], "/work/sub/up.txt");
    assert_eq!(
        std::fs::read_to_string(project.path().join("sub/up.txt")).unwrap(),
        "uploaded"
    );
    let back = proj.get("host.txt").await;
    assert_eq!(&back.body[..], b"from the host");
    s.finish().await;
}
