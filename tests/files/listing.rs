//! Directory listings: a cell's files, links and directories, the working directory itself,
//! names that are not UTF-8 and listings too long for their bound.

use hyper::StatusCode;

use crate::http::Session;
use crate::{output, server, TOKEN};

#[tokio::test(flavor = "multi_thread")]
async fn a_file_a_cell_wrote_downloads_byte_for_byte_and_directories_list() {
    let s = server("files-cell-written", |_| {}).await;
    let cw = Session::new(&s.api, TOKEN, "cw");
    cw.run(
        "import os\nos.makedirs('out/sub', exist_ok=True)\n\
         open('out/report.bin', 'wb').write(bytes(range(256)) * 4099)\n\
         open('out/empty', 'wb').close()\nos.symlink('/etc', 'out/link')",
    )
    .await;
    let expected: Vec<u8> = (0..=255u8).cycle().take(256 * 4099).collect();
    let back = cw.get("out/report.bin").await;
    assert_eq!(back.status, StatusCode::OK);
    assert!(back.body[..] == expected[..], "downloaded bytes differ");
    let empty = cw.get("out/empty").await;
    assert_eq!(empty.status, StatusCode::OK);
    assert!(empty.body.is_empty());

    let listing = cw.get("out").await;
    assert_eq!(listing.status, StatusCode::OK);
    let entries = listing.json()["entries"].as_array().unwrap().clone();
    let names: Vec<(&str, &str)> = entries
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        names,
        [
            ("empty", "file"),
            ("link", "symlink"),
            ("report.bin", "file"),
            ("sub", "dir")
        ]
    );
    assert_eq!(entries[2]["size"], 256 * 4099);
    assert!(entries[2]["modified"].as_str().unwrap().ends_with('Z'));
    // The working directory itself.
    let root = s.api.get("/v1/sessions/cw/files", Some(TOKEN)).await;
    assert_eq!(root.status, StatusCode::OK, "{}", root.json());
    assert!(root.json()["entries"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "out" && e["kind"] == "dir"));
    let missing = cw.get("out/nope").await;
    assert_eq!(missing.error(StatusCode::NOT_FOUND), "not_found");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_non_utf8_name_is_listed_with_replacement_characters_and_long_names_stay_in_bound() {
    let s = server("files-names", |_| {}).await;
    let names = Session::new(&s.api, TOKEN, "names");
    let result = names
        .run(
            "import os\nos.makedirs('bad')\nopen(b'bad/\\xff\\xfe', 'w').close()\n\
             open('bad/ok', 'w').close()\nos.makedirs('long')\n\
             for i in range(10000):\n    open('long/%05d' % i + '\\x01' * 245, 'w').close()\n\
             print('made')",
        )
        .await;
    assert_eq!(output(&result), "made", "{result}");
    let reply = names.get("bad").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    let listed: Vec<String> = reply.json()["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        listed,
        vec!["ok".to_string(), "\u{FFFD}\u{FFFD}".to_string()]
    );
    // 10,000 names that JSON escapes six-fold would pass the header bound: the listing is
    // truncated within it instead of failing.
    let reply = names.get("long").await;
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "{}",
        reply.error(reply.status)
    );
    let listing = reply.json();
    assert_eq!(listing["truncated"], true);
    let shown = listing["entries"].as_array().unwrap().len();
    assert!(shown > 500 && shown < 10_000, "{shown} entries");
    eprintln!(
        "a 10,000-entry listing of escaped names: {shown} entries, {} bytes",
        reply.body.len()
    );
    s.finish().await;
}
