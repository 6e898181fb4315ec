//! A fresh PostgreSQL database per test, on the server `KERNELBOX_TEST_POSTGRES` names (start
//! one with `eval "$(bash .ci/postgres)"`; docs/cluster.md, "Catalog schema"). Include it with
//! `#[path = "common/postgres.rs"] mod postgres;`. A missing server fails the test, never
//! skips it.
#![allow(dead_code)]

use std::time::Duration;

/// The variable naming the test server's URL (a database on it that may be used to create
/// others).
pub const ENV: &str = "KERNELBOX_TEST_POSTGRES";

/// Each step against the test server, at most.
const STEP: Duration = Duration::from_secs(20);

/// The test server's URL; panics with what to run when it is unset.
pub fn server_url() -> String {
    std::env::var(ENV).unwrap_or_else(|_| {
        panic!(
            "{ENV} is unset: these tests need a PostgreSQL server; start one with \
             `eval \"$(bash .ci/postgres)\"` (a missing database is a failure, not a skip)"
        )
    })
}

/// `url` with its database (the path) replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[scheme_end..].find('/') {
        Some(slash) => &base[..scheme_end + slash],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{database}?{q}"),
        None => format!("{base}/{database}"),
    }
}

/// Runs one statement on the test server's own database, on a thread of its own (so it works
/// from sync and async tests alike).
fn admin(sql: String) {
    let url = server_url();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the test database's set-up");
        rt.block_on(async {
            tokio::time::timeout(STEP, async {
                let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .unwrap_or_else(|e| {
                        panic!("cannot connect to {ENV} (run `.ci/postgres`): {e}")
                    });
                let conn = tokio::spawn(conn);
                client
                    .batch_execute(&sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                drop(client);
                let _ = conn.await;
            })
            .await
            .unwrap_or_else(|_| panic!("{ENV} did not answer within {STEP:?}"))
        })
    })
    .join()
    .expect("the test database's set-up");
}

/// Creates a new, uniquely named database on the test server and returns its URL.
pub fn fresh_database() -> String {
    let name = format!("kb_test_{}", uuid::Uuid::new_v4().simple());
    admin(format!("CREATE DATABASE {name}"));
    with_database(&server_url(), &name)
}

/// Drops a database [`fresh_database`] made (its connections are ended first).
pub fn drop_database(url: &str) {
    let name = url
        .split('?')
        .next()
        .and_then(|u| u.rsplit('/').next())
        .unwrap_or_default()
        .to_string();
    assert!(name.starts_with("kb_test_"), "not a test database: {name}");
    admin(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
}

/// A plain connection to `url` for the test's own queries (its connection task is spawned
/// on the current runtime).
pub async fn raw(url: &str) -> tokio_postgres::Client {
    let (client, conn) =
        tokio::time::timeout(STEP, tokio_postgres::connect(url, tokio_postgres::NoTls))
            .await
            .expect("connect in time")
            .expect("connect to the test database");
    tokio::spawn(conn);
    client
}
