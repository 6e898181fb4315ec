//! The resident file helper (docs/files.md "The resident helper"): one process for transfers in a
//! row, one-shot helpers beside a busy one, ended after its idle time.

use std::time::Duration;

use bytes::Bytes;
use hyper::body::Frame;
use hyper::StatusCode;

use crate::http::Session;
use crate::{helper_pids, helpers_settle, output, random_bytes, server, TOKEN};

#[tokio::test(flavor = "multi_thread")]
async fn transfers_in_a_row_use_one_resident_helper_process() {
    let s = server("files-resident", |_| {}).await;
    let res = Session::new(&s.api, TOKEN, "res");
    // Nothing runs in an idle kernel until files are used.
    res.run("print(1)").await;
    let id = res.container().await;
    assert_eq!(helper_pids(&id).await, Vec::<String>::new());
    let data = random_bytes(3 * 1024 * 1024);
    let mut seen = Vec::new();
    for round in 0..3 {
        let path = format!("f{round}.bin");
        let reply = res.put(&path, data.clone()).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
        let reply = res.get(&path).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.body == data, "round {round}: the bytes differ");
        assert_eq!(res.get("").await.status, StatusCode::OK);
        seen.push(helpers_settle(&id, 1).await);
    }
    eprintln!("helper pids after each round: {seen:?}");
    assert_eq!(seen[0].len(), 1, "{seen:?}");
    assert!(seen.iter().all(|p| *p == seen[0]), "{seen:?}");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn uploads_beside_one_holding_the_resident_helper_all_succeed() {
    let s = server("files-beside", |_| {}).await;
    let side = Session::new(&s.api, TOKEN, "side");
    assert_eq!(side.put("warm", "w").await.status, StatusCode::CREATED);
    let id = side.container().await;
    let resident = helpers_settle(&id, 1).await;
    // A slow client: its upload takes the idle resident helper and holds it.
    let (tx, slow) = side.paced_put("slow.bin");
    tx.send(Ok(Frame::data(Bytes::from(vec![b's'; 1024]))))
        .await
        .unwrap();
    // The slow upload is under way (its temporary file exists).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let check =
        "import os\nprint(any(n.startswith('.kernelbox-upload-') for n in os.listdir('.')))";
    while output(&side.run(check).await) != "True" {
        assert!(
            std::time::Instant::now() < deadline,
            "the slow upload never began"
        );
    }
    let data = random_bytes(2 * 1024 * 1024);
    let uploads = (0..4).map(|i| {
        let (side, data) = (&side, data.clone());
        async move { side.put(&format!("c{i}.bin"), data).await }
    });
    let started = std::time::Instant::now();
    let replies = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(uploads))
        .await
        .expect("the uploads beside the slow one never ended");
    eprintln!(
        "4 concurrent uploads beside a held helper: {:?}",
        started.elapsed()
    );
    for reply in &replies {
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    }
    assert!(!slow.is_finished(), "the slow upload ended early");
    tx.send(Ok(Frame::data(Bytes::from(vec![b's'; 1024]))))
        .await
        .unwrap();
    drop(tx);
    let reply = slow.await.unwrap().unwrap();
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    assert_eq!(reply.json()["size"], 2048);
    let check = "import hashlib\nprint(len({hashlib.sha256(open('c%d.bin' % i, 'rb').read()).hexdigest() for i in range(4)}), len(open('slow.bin', 'rb').read()))";
    assert_eq!(output(&side.run(check).await), "1 2048");
    // The one-shot helpers are gone; the resident one stays.
    assert_eq!(helpers_settle(&id, 1).await, resident);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_resident_helper_ends_after_its_idle_time() {
    let idle = Duration::from_secs(2);
    let s = server("files-idle", |c| c.files.helper_idle = idle).await;
    let session = Session::new(&s.api, TOKEN, "idle");
    assert_eq!(session.put("a.txt", "a").await.status, StatusCode::CREATED);
    let used = std::time::Instant::now();
    let id = session.container().await;
    assert_eq!(helpers_settle(&id, 1).await.len(), 1);
    // Polled through the engine, bounded: it is gone within its idle time and a margin.
    let deadline = used + idle + Duration::from_secs(15);
    while !helper_pids(&id).await.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the idle helper was not ended"
        );
        tokio::task::yield_now().await;
    }
    let gone = used.elapsed();
    eprintln!("the idle helper ended {gone:?} after its last use (idle time {idle:?})");
    assert!(gone >= idle, "ended before its idle time: {gone:?}");
    // The next operation starts a new one.
    let reply = session.get("a.txt").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(&reply.body[..], b"a");
    assert_eq!(helpers_settle(&id, 1).await.len(), 1);
    s.finish().await;
}
