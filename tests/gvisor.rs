//! gVisor as a kernel runtime (docs/runtimes.md) against the real engine, which must have
//! `runsc` registered (`.ci/runsc`): a runsc server's kernels run under gVisor with their
//! state kept; a runsc tenant of a runc server gets a runsc kernel of its own, never the warm
//! pool's runc one (and the pool's is still there for others); what cannot hold under runsc
//! (a network policy) is refused at start. The contract and hostile suites run under runsc too
//! (`KERNELBOX_TEST_RUNTIME=runsc`, `.ci/run`).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::Case;
use kernelbox::{CellStatus, ExecuteRequest, KernelRuntime, Orchestrator, Scope};

const READY: Duration = Duration::from_secs(60);

/// The runtime the engine created `id` (a short id) with, asked of the engine itself.
fn runtime_of(id: &str) -> String {
    let out = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.HostConfig.Runtime}}", id])
        .output()
        .unwrap();
    assert!(out.status.success(), "docker inspect {id}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// gVisor's own kernel answers `/proc/version` (the host's kernel is never seen).
const KERNEL_PROBE: &str = "print('gvisor' if '#1 SMP Sun Jan 10 15:06:54 PST 2016' in open('/proc/version').read() else 'host')";

#[tokio::test]
async fn a_runsc_servers_kernels_run_under_gvisor_and_keep_their_state() {
    let case = Case::with("gvisor-server", |c| {
        c.spec.sandbox.runtime = KernelRuntime::Runsc;
    })
    .await;
    let r = case.run("s", "x = 41").await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert_eq!(runtime_of(&r.kernel.id), "runsc");
    let r = case
        .run("s", &format!("{KERNEL_PROBE}\nprint(x + 1)"))
        .await;
    assert_eq!(r.output, "gvisor\n42\n", "{r:?}");
    assert!(r.kernel.reused);
    case.finish().await;
}

#[tokio::test]
async fn a_runsc_tenant_never_gets_the_pools_runc_kernel() {
    let case = Case::with("gvisor-pool", |c| {
        c.spec.sandbox.runtime = KernelRuntime::Runc;
        c.pool.size = 1;
        c.kernels.max_session_kernels = 4;
        c.tenant_runtimes = BTreeMap::from([("sealed".to_string(), KernelRuntime::Runsc)]);
    })
    .await;
    assert!(case.kb.wait_pool_ready(1, READY).await, "the pool fills");
    let pooled = case.container_ids().await;
    assert_eq!(pooled.len(), 1, "{pooled:?}");
    assert_eq!(runtime_of(&pooled[0]), "runc");

    let sealed = case
        .exec(ExecuteRequest {
            scope: Scope::session("s").tenant("sealed"),
            ..ExecuteRequest::new("s", KERNEL_PROBE)
        })
        .await;
    assert_eq!(sealed.output, "gvisor\n", "{sealed:?}");
    assert!(
        !pooled.contains(&sealed.kernel.id),
        "a runsc tenant took the runc pool kernel"
    );
    assert_eq!(runtime_of(&sealed.kernel.id), "runsc");

    // The pool's kernel is still there for a runc tenant, who gets it.
    let plain = case.run("p", KERNEL_PROBE).await;
    assert_eq!(plain.output, "host\n", "{plain:?}");
    assert_eq!(
        plain.kernel.id, pooled[0],
        "the runc tenant takes the pooled kernel"
    );
    case.finish().await;
}

#[tokio::test]
async fn a_network_policy_under_runsc_is_refused_at_start() {
    let label = common::unique("gvisor-network");
    let mut config = common::config(&label);
    config.tenant_runtimes = BTreeMap::from([("sealed".to_string(), KernelRuntime::Runsc)]);
    config.egress = Some(kernelbox::config::EgressConfig {
        tenants: BTreeMap::from([(
            "sealed".to_string(),
            kernelbox::wire::NetworkPolicy {
                allow: vec!["pypi".into()],
                deny: vec![],
            },
        )]),
        ca_bundle: kernelbox::config::DEFAULT_CA_BUNDLE.into(),
        limits: Default::default(),
        audit: None,
        credentials: None,
    });
    let engine = common::engine().await;
    let message = match Orchestrator::start(config, engine.clone()).await {
        Ok(_) => panic!("a runsc tenant with a network policy is refused"),
        Err(e) => e.to_string(),
    };
    assert!(
        message.contains("tenant sealed has a network policy") && message.contains("runsc"),
        "{message}"
    );
    common::assert_clean(&engine, &label).await;
}
