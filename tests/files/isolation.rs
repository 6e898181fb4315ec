//! What a file request can reach: only the session's working directory (traversal, absolute
//! paths, planted symlinks are refused) and only the session's own kernel (none started by a
//! read, none of another tenant's, a child's its own).

use hyper::{Method, StatusCode};

use crate::http::Session;
use crate::{output, server, tar_of, OTHER, TOKEN};

#[tokio::test(flavor = "multi_thread")]
async fn traversal_absolute_paths_and_planted_symlinks_are_refused_and_nothing_outside_is_touched()
{
    let s = server("files-escape", |_| {}).await;
    let esc = Session::new(&s.api, TOKEN, "esc");
    esc.run(
        "import os\nos.symlink('/', 'root')\nos.symlink('/proc/1/environ', 'environ')\n\
         os.symlink('/tmp', 'tmpdir')\nos.makedirs('real')\nos.symlink('/tmp', 'real/deeper')\n\
         open('/tmp/secret', 'w').write('outside')",
    )
    .await;
    let refused = [
        // `..` (percent-encoded so no client normalises it away) and absolute paths.
        (Method::GET, "%2E%2E/%2E%2E/etc/passwd", "invalid_path"),
        (Method::GET, "real/%2E%2E/%2E%2E/tmp/secret", "invalid_path"),
        (Method::GET, "%2Fetc%2Fpasswd", "invalid_path"),
        (Method::PUT, "%2E%2E/x", "invalid_path"),
        (Method::PUT, "%2Ftmp%2Fx", "invalid_path"),
        // Planted symlinks, as the last component or on the way.
        (Method::GET, "environ", "symlink"),
        (Method::GET, "root/etc/passwd", "not_a_directory"),
        (Method::GET, "root", "symlink"),
        (Method::GET, "tmpdir/secret", "not_a_directory"),
        (Method::GET, "real/deeper/secret", "not_a_directory"),
        (Method::PUT, "tmpdir/planted", "not_a_directory"),
        (Method::PUT, "root/tmp/planted", "not_a_directory"),
        (Method::PUT, "real/deeper/planted", "not_a_directory"),
        (Method::DELETE, "tmpdir/secret", "not_a_directory"),
        (Method::DELETE, "%2E%2E", "invalid_path"),
    ];
    for (method, path, code) in refused {
        let reply = match method {
            Method::PUT => esc.put(path, b"evil").await,
            Method::GET => esc.get(path).await,
            _ => esc.delete(path).await,
        };
        assert_eq!(
            reply.error(StatusCode::BAD_REQUEST),
            code,
            "{method} {path}"
        );
    }
    // A tar into a directory reached through a symlink is refused the same way.
    let reply = esc.put_tar("tmpdir", tar_of(&[("a", b"1")])).await;
    assert_eq!(reply.error(StatusCode::BAD_REQUEST), "not_a_directory");
    // Writing over a symlink's name replaces the link; its target is untouched.
    let reply = esc.put("environ", b"mine").await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    let result = esc
        .run(
            "import os\nprint(sorted(os.listdir('/tmp')), open('/tmp/secret').read(), \
             os.path.islink('environ'), open('environ').read(), os.path.islink('tmpdir'))",
        )
        .await;
    assert_eq!(
        output(&result),
        "['secret'] outside False mine True",
        "{result}"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn no_kernel_other_tenants_and_children_are_isolated() {
    let s = server("files-isolation", |_| {}).await;
    let iso = Session::new(&s.api, TOKEN, "iso");
    let theirs = Session::new(&s.api, OTHER, "iso");
    // A session that never ran, for every read verb: 404 no_kernel, and nothing is started.
    let reply = iso.get("a.txt").await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    let reply = s.api.get("/v1/sessions/iso/files", Some(TOKEN)).await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    let reply = iso.delete("a.txt").await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    assert!(s.api.kernels(TOKEN).await.is_empty());

    let reply = iso.put("a.txt", b"mine").await;
    assert_eq!(reply.status, StatusCode::CREATED);
    // Another tenant naming the same session reaches nothing of it.
    let reply = theirs.get("a.txt").await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    let reply = theirs.delete("a.txt").await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    // Its upload starts its own kernel, and its file stays its own.
    let reply = theirs.put("a.txt", b"theirs").await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(s.tenant_containers("files").await.len(), 1);
    assert_eq!(s.tenant_containers("others").await.len(), 1);
    assert_eq!(&iso.get("a.txt").await.body[..], b"mine");
    assert_eq!(&theirs.get("a.txt").await.body[..], b"theirs");

    // A delegated child's kernel has files of its own.
    let child = "c.txt?child=helper";
    let reply = iso.get(child).await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    let reply = iso.put(child, b"child's").await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    let seen = s
        .api
        .execute(
            TOKEN,
            "iso",
            serde_json::json!({"code": "print(open('c.txt').read())", "child": "helper"}),
        )
        .await
        .json();
    assert_eq!(output(&seen), "child's", "{seen}");
    let reply = iso.get("c.txt").await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "not_found");
    assert_eq!(&iso.get(child).await.body[..], b"child's");
    let reply = iso.get("c.txt?child=bad::name").await;
    assert_eq!(reply.error(StatusCode::BAD_REQUEST), "invalid_name");

    // Files live and die with the kernel.
    assert_eq!(
        s.api.delete("/v1/sessions/iso", TOKEN).await.status,
        StatusCode::OK
    );
    let reply = iso.get("a.txt").await;
    assert_eq!(reply.error(StatusCode::NOT_FOUND), "no_kernel");
    s.finish().await;
}
