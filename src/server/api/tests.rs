use super::stream::{StreamTx, Utf8Stream, MAX_STREAM_BACKLOG};
use super::*;
use axum::body::Bytes;
use std::sync::Arc;

#[test]
fn request_bodies_must_be_json_objects() {
    #[derive(Debug, serde::Deserialize)]
    struct Body {
        #[allow(dead_code)]
        code: String,
    }
    for (body, got) in [
        (&b"[\"print(1)\"]"[..], "an array"),
        (b" []", "an array"),
        (b"\"x\"", "a string"),
        (b"1", "a number"),
        (b"-1", "a number"),
        (b"null", "null"),
        (b"true", "a boolean"),
        (b"", "an empty body"),
        (b"<x/>", "something that is not JSON"),
    ] {
        let err = json_object::<Body>(body).unwrap_err();
        assert_eq!(err.code, "invalid_json");
        assert_eq!(
            err.message,
            format!("the request body must be a JSON object, got {got}")
        );
    }
    assert!(json_object::<Body>(b"\n {\"code\": \"1\"}").is_ok());
    let err = json_object::<Body>(b"{\"code\": 1}").unwrap_err();
    assert_eq!(err.code, "invalid_json");
}

#[test]
fn a_stream_nobody_reads_drops_output_past_its_backlog() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let pending = Arc::new(super::pending::Pending::new(Default::default()));
    let meter = super::pending::Meter::new(pending.clone());
    meter.set_tenant("acme");
    let tx = StreamTx {
        tx,
        queued: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        meter,
    };
    let line = Bytes::from(vec![b'x'; 64 * 1024]);
    let admitted = (0..100).filter(|_| tx.try_send(line.clone())).count();
    assert_eq!(admitted, MAX_STREAM_BACKLOG / line.len());
    // The closing events always go through.
    tx.send_final(Bytes::from_static(b"result"), true);
    // Every queued line counts against the tenant and the host until it is taken.
    let queued = admitted * line.len() + b"result".len();
    assert_eq!(pending.held(Some("acme")), (queued as u64, queued as u64));
    let mut got = 0;
    while let Ok((bytes, last, _, _)) = rx.try_recv() {
        got += 1;
        if last {
            assert_eq!(&bytes[..], b"result");
        }
    }
    assert_eq!(got, admitted + 1);
    assert_eq!(pending.held(Some("acme")), (0, 0));
}

#[test]
fn split_characters_are_carried_and_output_is_capped() {
    let mut s = Utf8Stream {
        carry: Vec::new(),
        sent: 0,
        cap: 8,
        dropped: 0,
    };
    let euro = "€".as_bytes();
    assert_eq!(s.push(&euro[..1]), "");
    assert_eq!(s.push(&euro[1..]), "€");
    assert_eq!(s.push(b"a\xffb"), "a\u{FFFD}b");
    assert_eq!(s.push(b"cdef"), "cd");
    assert_eq!(s.dropped, 2);
    assert_eq!(s.finish(), "");
}
