//! The client against a router made as the server's is (axum's `Path` and `Query` decode what
//! the URL builder encoded), and the reader of the server's error JSON.

use std::collections::HashMap;

use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};

use super::*;
use crate::wire::ErrorBody;

/// Serves `router` on a free local port; its base URL (with a trailing `/`, which the client
/// drops).
async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}/")
}

/// A refusal whose message is `text`, so that a test reads back what the router decoded.
fn echo(text: String) -> (StatusCode, Json<ErrorBody>) {
    (StatusCode::IM_A_TEAPOT, Json(ErrorBody::new("echo", text)))
}

/// What the server's routes would decode, echoed.
fn echoing_router() -> Router {
    Router::new()
        .route(
            "/v1/sessions/{session}/execute",
            post(|Path(session): Path<String>| async move { echo(session) }),
        )
        .route(
            "/v1/sessions/{session}/network",
            put(
                |Path(session): Path<String>, Json(policy): Json<NetworkPolicy>| async move {
                    echo(format!("{session}|{:?}|{:?}", policy.allow, policy.deny))
                },
            ),
        )
        .route(
            "/v1/sessions/{session}",
            delete(|Path(session): Path<String>| async move { echo(session) }),
        )
        .route(
            "/v1/sessions/{session}/files/{*path}",
            get(
                |Path((session, path)): Path<(String, String)>,
                 Query(query): Query<HashMap<String, String>>| async move {
                    echo(format!("{session}|{path}|{:?}", query.get("child")))
                },
            ),
        )
}

/// The message of a refusal, or a panic naming what came instead.
fn refused<T>(answer: Result<T, ClientError>) -> String {
    match answer {
        Err(ClientError::Refused { status, message }) => {
            assert_eq!(status, StatusCode::IM_A_TEAPOT);
            message
        }
        Err(other) => panic!("not a refusal: {other}"),
        Ok(_) => panic!("not a refusal: an answer"),
    }
}

#[tokio::test]
async fn names_and_paths_reach_the_router_as_they_were_written() {
    let client = Client::new(&serve(echoing_router()).await, Some("t".into()));
    let session = "a/b c%d+e?f#g é日";
    let body = ExecuteBody::default();
    assert_eq!(refused(client.execute(session, &body).await), session);
    assert_eq!(refused(client.clear_session(session).await), session);
    let policy = NetworkPolicy {
        allow: vec!["pypi".into()],
        deny: vec!["10.0.0.0/8".into()],
    };
    assert_eq!(
        refused(client.set_network(session, &policy).await),
        format!("{session}|[\"pypi\"]|[\"10.0.0.0/8\"]")
    );
    let target = FileTarget {
        session,
        child: Some("c/1 %2F+é"),
        path: "dir/x y%z?#+.txt",
    };
    assert_eq!(
        refused(client.download(&target, false).await),
        format!("{session}|dir/x y%z?#+.txt|Some(\"c/1 %2F+é\")")
    );
}

#[test]
fn the_error_reader_takes_the_servers_message_or_says_the_request_failed() {
    let body =
        serde_json::to_vec(&ErrorBody::new("no_kernel", "s has no live kernel")).expect("JSON");
    let e = ClientError::refused(StatusCode::NOT_FOUND, &body);
    assert_eq!(
        e.to_string(),
        "server answered 404 Not Found: s has no live kernel"
    );
    for body in [&b"<html>Bad Gateway</html>"[..], b"", b"{\"error\": \"x\"}"] {
        let e = ClientError::refused(StatusCode::BAD_GATEWAY, body);
        assert_eq!(
            e.to_string(),
            "server answered 502 Bad Gateway: request failed"
        );
    }
}

#[test]
fn an_answer_that_is_not_json_is_told_from_one_of_another_shape() {
    let decode = |text: &[u8]| {
        let error = serde_json::from_slice::<CellResult>(text).expect_err("not a result");
        ClientError::decode(StatusCode::OK, "a cell result", error)
    };
    assert!(matches!(decode(b"<html>"), ClientError::NotJson { .. }));
    assert!(matches!(
        decode(b"{\"status\": \"success\"}"),
        ClientError::Unexpected { .. }
    ));
}
