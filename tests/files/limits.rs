//! Size and space: an upload over the cap (413) or into a full working directory (507) leaves
//! nothing behind.

use hyper::StatusCode;

use crate::http::Session;
use crate::{output, server, tar_of, TOKEN};

#[tokio::test(flavor = "multi_thread")]
async fn an_upload_over_the_cap_is_413_and_leaves_no_file_behind() {
    let s = server("files-cap", |c| c.files.max_upload_bytes = 1024 * 1024).await;
    let cap = Session::new(&s.api, TOKEN, "cap");
    cap.run("x = 1").await;
    // Declared too large: refused before anything reaches the kernel.
    let reply = cap.put("big.bin", vec![1; 1024 * 1024 + 1]).await;
    assert_eq!(reply.error(StatusCode::PAYLOAD_TOO_LARGE), "file_too_large");
    // Streamed without a length: cut at the cap, the partial file removed.
    let reply = cap.put_streamed("d/big.bin", 40, 64 * 1024).await;
    assert_eq!(reply.error(StatusCode::PAYLOAD_TOO_LARGE), "file_too_large");
    let reply = cap.put_streamed("d/ok.bin", 16, 64 * 1024).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json());
    let result = cap
        .run("import os\nprint(sorted(os.listdir('.')), sorted(os.listdir('d')), os.path.getsize('d/ok.bin'))")
        .await;
    assert_eq!(
        output(&result),
        "['.kernelbox', 'd'] ['ok.bin'] 1048576",
        "{result}"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upload_into_a_full_work_dir_is_507_and_leaves_nothing() {
    let s = server("files-full", |c| {
        c.spec.sandbox.work_bytes = Some(8 * 1024 * 1024)
    })
    .await;
    let full = Session::new(&s.api, TOKEN, "full");
    full.run("import os\nos.mkdir('was')\nopen('keep.bin', 'wb').write(b'k' * (4 * 1024 * 1024))")
        .await;
    let reply = full.put("big.bin", vec![7; 6 * 1024 * 1024]).await;
    assert_eq!(reply.error(StatusCode::INSUFFICIENT_STORAGE), "no_space");
    // The directories an upload made on its way go with it; those that were there stay.
    let reply = full.put("new/deep/big.bin", vec![7; 6 * 1024 * 1024]).await;
    assert_eq!(reply.error(StatusCode::INSUFFICIENT_STORAGE), "no_space");
    let tar = tar_of(&[("a.bin", &vec![1u8; 6 * 1024 * 1024])]);
    let reply = full.put_tar("t", tar.clone()).await;
    assert_eq!(reply.error(StatusCode::INSUFFICIENT_STORAGE), "no_space");
    let reply = full.put_tar("was/t/u", tar).await;
    assert_eq!(reply.error(StatusCode::INSUFFICIENT_STORAGE), "no_space");
    let result = full
        .run("import os\nprint(sorted(os.listdir('.')), os.listdir('was'), os.path.getsize('keep.bin'))")
        .await;
    assert_eq!(
        output(&result),
        "['.kernelbox', 'keep.bin', 'was'] [] 4194304",
        "{result}"
    );
    s.finish().await;
}
