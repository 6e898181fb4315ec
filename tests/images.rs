//! The data-science kernel image (docs/images.md "Images"), end to end on the real engine: a kernel on
//! it imports numpy, pandas, scipy, pillow and matplotlib and draws a PNG with Agg under the
//! hardened sandbox (read-only root, HOME=/tmp) without rebuilding matplotlib's font cache;
//! and it is what a kernel gets through each way of naming an image: the library's
//! `Config::spec.image`, `kernelbox exec --image`, and a tenant's `image` in the tenants file.
//!
//! The image must already be on the engine (`kernelbox image build --preset datascience`;
//! `.ci/run` builds it when missing): it takes minutes to build, so no test builds it.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use std::time::Duration;

use common::{Case, CASE};
use kernelbox::image::DATASCIENCE_IMAGE;
use kernelbox::{CellStatus, ExecuteRequest, Scope};
use serde_json::{json, Value};

/// A cell that imports the five packages, checks matplotlib's backend and cache, and draws a
/// 4x3-inch figure at dpi 100 into the working directory, printing the PNG's first 24 bytes.
const DRAW: &str = r#"
import logging, os
# matplotlib logs "generated new fontManager" (INFO) when it scans the fonts itself.
logging.basicConfig(level=logging.INFO, format="LOG %(name)s %(message)s")
import numpy, pandas, scipy, scipy.linalg, scipy.optimize, scipy.stats, PIL.Image
import matplotlib
import matplotlib.pyplot as plt
import mpl_toolkits.mplot3d
print("backend", matplotlib.get_backend())
print("cachedir", matplotlib.get_cachedir())
frame = pandas.DataFrame({"x": numpy.arange(5), "y": numpy.arange(5) ** 2})
print("fit", round(float(scipy.optimize.minimize_scalar(lambda v: (v - 3) ** 2).x), 3))
fig, ax = plt.subplots(figsize=(4, 3), dpi=100)
ax.plot(frame.x, frame.y)
print("canvas", type(fig.canvas).__name__)
fig.savefig("figure.png")
plt.close(fig)
print("image", PIL.Image.open("figure.png").size)
with open("figure.png", "rb") as f:
    print("png", f.read(24).hex())
"#;

/// Width and height from a PNG's first 24 bytes (signature, IHDR length and type, then
/// width and height big-endian), given as hex.
fn png_size(hex_head: &str) -> (u32, u32) {
    let bytes: Vec<u8> = (0..hex_head.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex_head[i..i + 2], 16).unwrap())
        .collect();
    assert_eq!(bytes.len(), 24, "{hex_head}");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG: {hex_head}");
    assert_eq!(&bytes[12..16], b"IHDR", "{hex_head}");
    let word = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    (word(16), word(20))
}

/// Asserts the output of [`DRAW`]: an Agg canvas, the cache on the kernel's tmpfs, no font scan, no
/// matplotlib warning, a 400x300 PNG.
fn assert_drawn(output: &str) {
    // Agg, or the runner's inline backend built on it (docs/results.md "The result of a cell").
    assert!(
        output.contains("backend agg") || output.contains("backend module://kernelbox_inline"),
        "{output}"
    );
    assert!(output.contains("canvas FigureCanvasAgg"), "{output}");
    assert!(output.contains("cachedir /tmp/matplotlib"), "{output}");
    assert!(output.contains("fit 3.0"), "{output}");
    assert!(
        !output.contains("generated new fontManager"),
        "matplotlib rebuilt its font cache instead of using the image's: {output}"
    );
    assert!(
        !output.contains("not a writable directory") && !output.contains("WARNING"),
        "{output}"
    );
    assert!(output.contains("image (400, 300)"), "{output}");
    let head = output
        .lines()
        .find_map(|l| l.strip_prefix("png "))
        .unwrap_or_else(|| panic!("no PNG header printed: {output}"));
    assert_eq!(png_size(head.trim()), (400, 300), "{output}");
}

/// The image a container was created from, as the engine reports it.
async fn image_of(id: &str) -> String {
    let docker = bollard::Docker::connect_with_defaults().unwrap();
    let info = docker.inspect_container(id, None).await.unwrap();
    info.config.and_then(|c| c.image).unwrap_or_default()
}

/// Fails clearly when the image has not been built.
async fn require_image(case_engine: &std::sync::Arc<dyn kernelbox::Engine>) {
    assert!(
        case_engine.image_exists(DATASCIENCE_IMAGE).await.unwrap(),
        "{DATASCIENCE_IMAGE} is missing: build it with `kernelbox image build --preset datascience`"
    );
}

#[tokio::test]
async fn a_datascience_kernel_imports_the_five_and_draws_a_png_with_agg() {
    let case = Case::with("ds-config", |c| c.spec.image = DATASCIENCE_IMAGE.into()).await;
    require_image(&case.engine).await;
    let r = case.run("ds", DRAW).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert_drawn(&r.output);
    // State persists as in any kernel, with the libraries loaded.
    let again = case
        .run("ds", "print(type(frame).__name__, int(numpy.sum(frame.y)))")
        .await;
    assert_eq!(again.status, CellStatus::Success, "{again:?}");
    assert!(again.output.contains("DataFrame 30"), "{again:?}");
    let containers = case.containers().await;
    assert_eq!(containers.len(), 1, "{containers:?}");
    assert_eq!(image_of(&containers[0].id).await, DATASCIENCE_IMAGE);
    case.finish().await;
}

#[tokio::test]
async fn the_plain_image_stays_the_default_and_has_none_of_them() {
    let case = Case::new("ds-default").await;
    let r = case
        .run(
            "plain",
            "import importlib.util as u\n\
             print([m for m in ('numpy', 'pandas', 'scipy', 'PIL', 'matplotlib') if u.find_spec(m)])",
        )
        .await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert!(r.output.contains("[]"), "{r:?}");
    let containers = case.containers().await;
    assert_eq!(
        image_of(&containers[0].id).await,
        kernelbox::config::DEFAULT_IMAGE
    );
    case.finish().await;
}

#[tokio::test]
async fn a_request_naming_the_image_gets_it() {
    // The library's per-request image: what a tenant's `image` becomes.
    let case = Case::new("ds-request").await;
    require_image(&case.engine).await;
    let ds = case
        .exec(ExecuteRequest::new(
            Scope::session("s").image(DATASCIENCE_IMAGE),
            "import numpy; print(numpy.ones(3).sum())",
        ))
        .await;
    assert_eq!(ds.status, CellStatus::Success, "{ds:?}");
    assert!(ds.output.contains("3.0"), "{ds:?}");
    let empty = case
        .kb
        .execute(ExecuteRequest::new(Scope::session("s").image(" "), "pass"));
    let err = empty.await.unwrap_err().to_string();
    assert!(err.contains("image must not be empty"), "{err}");
    case.finish().await;
}

#[tokio::test]
async fn a_request_naming_the_image_never_takes_a_pooled_plain_kernel() {
    // The warm pool holds kernels of the configured (plain) image only.
    let case = Case::with("ds-pool", |c| c.pool.size = 1).await;
    require_image(&case.engine).await;
    assert!(
        case.kb.wait_pool_ready(1, Duration::from_secs(60)).await,
        "the pool fills"
    );
    let ds = case
        .exec(ExecuteRequest::new(
            Scope::session("s").image(DATASCIENCE_IMAGE),
            "import numpy; print(numpy.ones(2).sum())",
        ))
        .await;
    assert_eq!(ds.status, CellStatus::Success, "{ds:?}");
    assert!(ds.output.contains("2.0"), "{ds:?}");
    let id = case
        .containers()
        .await
        .into_iter()
        .find(|c| c.id.starts_with(&ds.kernel.id))
        .expect("the cell's kernel")
        .id;
    assert_eq!(image_of(&id).await, DATASCIENCE_IMAGE);
    case.finish().await;
}

#[tokio::test]
async fn exec_with_the_image_flag_runs_on_the_datascience_image() {
    let label = common::unique("ds-cli");
    let engine = common::engine().await;
    require_image(&engine).await;
    let out = tokio::time::timeout(
        Duration::from_secs(180),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
            .args(["exec", "--image", DATASCIENCE_IMAGE, "--label"])
            .arg(format!("{CASE}={label}"))
            .arg(DRAW)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("exec finished within 180 s")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let result: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(result["status"], "success", "{result}");
    assert_drawn(result["output"].as_str().unwrap());
    common::assert_clean(&engine, &label).await;
}

#[tokio::test]
async fn a_tenant_naming_the_datascience_image_gets_it_and_others_do_not() {
    let mut ds = http::tenant("ds", "ds-token");
    ds["image"] = json!(DATASCIENCE_IMAGE);
    let tenants = http::tenants(vec![ds, http::tenant("plain", "plain-token")]);
    let server = http::TestServer::start("ds-tenant", tenants, |_| {}).await;
    require_image(&server.engine).await;
    let result = server.api.run("ds-token", "work", DRAW).await;
    assert_drawn(result["output"].as_str().unwrap());
    // The other tenant, same session name, gets the server's image: no numpy there.
    let reply = server
        .api
        .execute("plain-token", "work", json!({"code": "import numpy"}))
        .await;
    let plain = reply.json();
    assert_eq!(plain["status"], "error", "{plain}");
    assert!(
        plain["error"]
            .as_str()
            .unwrap()
            .contains("No module named 'numpy'"),
        "{plain}"
    );
    // An upload that starts a kernel starts it on the tenant's image: the next cell runs in
    // that same kernel, with numpy and the file.
    let put = server
        .api
        .send_bytes(
            hyper::Method::PUT,
            "/v1/sessions/upload-first/files/data.txt",
            Some("ds-token"),
            false,
            Some(bytes::Bytes::from_static(b"41")),
        )
        .await;
    assert!(put.status.is_success(), "{}", put.status);
    let after = server
        .api
        .run(
            "ds-token",
            "upload-first",
            "import numpy; print(numpy.int64(open('data.txt').read()) + 1)",
        )
        .await;
    assert!(after["output"].as_str().unwrap().contains("42"), "{after}");
    assert_eq!(after["kernel"]["reused"], true, "{after}");
    server
        .api
        .delete("/v1/sessions/upload-first", "ds-token")
        .await;
    let ds_ids = server.tenant_containers("ds").await;
    let plain_ids = server.tenant_containers("plain").await;
    assert_eq!((ds_ids.len(), plain_ids.len()), (1, 1));
    assert_eq!(image_of(&ds_ids[0]).await, DATASCIENCE_IMAGE);
    assert_eq!(
        image_of(&plain_ids[0]).await,
        kernelbox::config::DEFAULT_IMAGE
    );
    server.finish().await;
}

#[tokio::test]
async fn serve_refuses_to_start_when_a_tenant_names_a_missing_image() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.json");
    let mut entry = http::tenant("ds", "ds-token");
    entry["image"] = json!("kernelbox/no-such-image:missing");
    std::fs::write(&file, json!({ "tenants": [entry] }).to_string()).unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
            .args(["serve", "--listen", "127.0.0.1:0", "--tenants"])
            .arg(&file)
            .env("KERNELBOX_STATE_DIR", dir.path().join("state"))
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("serve exited within 60 s")
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains("kernelbox/no-such-image:missing"),
        "{stderr}"
    );
}

/// A new owner's first plot: which of the data stack was loaded before the cell imported it,
/// then a small DataFrame plotted with pyplot (shown inline at the cell's end).
const FIRST_PLOT: &str = r#"
import sys
print([m in sys.modules for m in ("numpy", "pandas", "matplotlib.pyplot")])
import pandas as pd
import matplotlib.pyplot as plt
pd.DataFrame({"x": [1, 2, 3], "y": [3, 1, 2]}).plot(x="x", y="y")
plt.show()
"#;

#[tokio::test]
async fn a_pool_preloading_the_data_stack_hands_a_new_owner_a_kernel_that_plots_at_once() {
    let case = Case::with("ds-preload", |c| {
        c.spec.image = DATASCIENCE_IMAGE.into();
        c.pool.size = 1;
        c.pool.preload = ["numpy", "pandas", "matplotlib.pyplot"]
            .map(String::from)
            .to_vec();
    })
    .await;
    require_image(&case.engine).await;
    assert!(
        case.kb.wait_pool_ready(1, Duration::from_secs(120)).await,
        "the preloading pool fills"
    );
    let r = case.run("plotter", FIRST_PLOT).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert!(!r.kernel.reused && r.kernel.execution_count == 1, "{r:?}");
    assert_eq!(r.output, "[True, True, True]\n", "{r:?}");
    let pngs: Vec<_> = r
        .results
        .iter()
        .filter(|b| b.data.contains_key("image/png"))
        .collect();
    assert_eq!(pngs.len(), 1, "one inline figure: {:?}", r.results);
    case.finish().await;
}
