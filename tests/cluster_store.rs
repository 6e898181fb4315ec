//! The cluster's PostgreSQL store against a real PostgreSQL (docs/cluster.md, "Catalog
//! schema"): migrations, node epochs and leases by the database's clock, fencing, session
//! claims and their races, tenant caps across nodes, and the catalog trait over the shared
//! tables. Needs `KERNELBOX_TEST_POSTGRES` (`eval "$(bash .ci/postgres)"`); each test makes
//! its own database and drops it when it passes.

#[path = "common/postgres.rs"]
mod postgres;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kernelbox::catalog::{Catalog, CatalogError, Change, Entry, EntryState};
use kernelbox::cluster::{
    Claim, ClaimRequest, NodeInfo, NodeState, PostgresCatalog, Renewal, Store,
};
use kernelbox::{LossReason, StateLost};

fn node(name: &str) -> NodeInfo {
    node_with_ttl(name, Duration::from_secs(10))
}

fn node_with_ttl(name: &str, lease_ttl: Duration) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        advertise: format!("http://{name}.test:8080"),
        capacity: 16,
        lease_ttl,
    }
}

fn claim_req(
    tenant: &str,
    session: &str,
    node: &str,
    epoch: i64,
    cap: Option<u32>,
) -> ClaimRequest {
    ClaimRequest {
        tenant: tenant.into(),
        session: session.into(),
        node: node.into(),
        epoch,
        tenant_cap: cap,
    }
}

fn started(key: &str, tenant: &str, owner: &str, generation: u64) -> Change {
    Change::Started {
        key_hash: key.into(),
        tenant: tenant.into(),
        owner: owner.into(),
        generation,
    }
}

fn loss(reason: LossReason) -> StateLost {
    StateLost {
        reason,
        at: "2026-12-03T10:00:00Z".into(),
        workspace_lost: false,
    }
}

fn lost(key: &str, tenant: &str, owner: &str, generation: u64, reason: LossReason) -> Change {
    Change::Lost {
        key_hash: key.into(),
        tenant: tenant.into(),
        owner: owner.into(),
        generation,
        loss: loss(reason),
    }
}

/// A node's catalog writer side: the catalog and the epoch it writes for.
struct Writer {
    catalog: PostgresCatalog,
    epoch: Arc<AtomicI64>,
}

impl Writer {
    fn new(store: &Store, name: &str, epoch: i64) -> Writer {
        let epoch = Arc::new(AtomicI64::new(epoch));
        let catalog = PostgresCatalog::new(
            store.clone(),
            name.into(),
            epoch.clone(),
            tokio::runtime::Handle::current(),
        );
        Writer { catalog, epoch }
    }

    /// Applies `changes` as the catalog writer does: from a thread that is no runtime worker.
    async fn apply(&self, changes: Vec<Change>) -> Result<(), CatalogError> {
        let catalog = self.catalog.clone();
        tokio::task::spawn_blocking(move || catalog.apply(&changes))
            .await
            .expect("the catalog write's thread")
    }
}

/// The session's kernels' rows, by claiming it again on the node that holds it.
async fn entries(store: &Store, req: &ClaimRequest) -> Vec<Entry> {
    match store.claim(req).await.expect("claim") {
        Claim::Claimed { entries } => entries,
        other => panic!("expected Claimed, got {other:?}"),
    }
}

fn entry<'a>(entries: &'a [Entry], key: &str) -> &'a Entry {
    entries
        .iter()
        .find(|e| e.key_hash == key)
        .unwrap_or_else(|| panic!("no row {key} in {entries:?}"))
}

fn lost_with(e: &Entry) -> Option<LossReason> {
    match &e.state {
        EntryState::Lost { loss } => Some(loss.reason),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_are_applied_once_by_concurrent_connects_and_again_change_nothing() {
    let url = postgres::fresh_database();
    let (a, b) = tokio::join!(Store::connect(&url), Store::connect(&url));
    a.expect("first connect");
    b.expect("second connect");
    Store::connect(&url).await.expect("a third connect");
    let raw = postgres::raw(&url).await;
    let versions: Vec<i32> = raw
        .query("SELECT version FROM kernelbox_schema ORDER BY version", &[])
        .await
        .expect("versions")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, [1, 2, 3, 4, 5, 6, 7]);
    let tables: i64 = raw
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE tablename IN ('kb_nodes', 'kb_sessions', 'kb_kernels')",
            &[],
        )
        .await
        .expect("tables")
        .get(0);
    assert_eq!(tables, 3);
    // A database a newer kernelbox migrated is refused, not written.
    raw.execute("INSERT INTO kernelbox_schema VALUES (99)", &[])
        .await
        .expect("pretend a newer schema");
    let err = Store::connect(&url).await.expect_err("a newer schema");
    assert!(err.to_string().contains("version 99"), "{err}");
    postgres::drop_database(&url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_renew_drain_and_leave() {
    let url = postgres::fresh_database();
    let store = Store::connect(&url).await.expect("connect");
    let e1 = store
        .register(&node("a"), LossReason::ServerRestarted)
        .await
        .expect("register");
    assert_eq!(
        store.renew("a", e1, 3).await.expect("renew"),
        Renewal::Renewed
    );
    let rows = store.nodes().await.expect("nodes");
    assert_eq!(rows.len(), 1);
    let a = &rows[0];
    assert_eq!(
        (
            a.name.as_str(),
            a.advertise.as_str(),
            a.epoch,
            a.state,
            a.draining
        ),
        ("a", "http://a.test:8080", e1, NodeState::Live, false)
    );
    assert_eq!((a.capacity, a.live_kernels), (16, 3));
    assert!(a.lease_age < Duration::from_secs(5), "{:?}", a.lease_age);

    assert!(store.set_draining("a", true).await.expect("drain"));
    assert!(!store.set_draining("nobody", true).await.expect("drain"));
    assert!(store.nodes().await.expect("nodes")[0].draining);

    // A new epoch: only it renews; registering again is not draining.
    let e2 = store
        .register(&node("a"), LossReason::ServerRestarted)
        .await
        .expect("register again");
    assert!(e2 > e1);
    assert_eq!(
        store.renew("a", e1, 0).await.expect("renew"),
        Renewal::Fenced
    );
    assert_eq!(
        store.renew("a", e2, 0).await.expect("renew"),
        Renewal::Renewed
    );
    assert_eq!(
        store.renew("nobody", e2, 0).await.expect("renew"),
        Renewal::Fenced
    );
    assert!(!store.nodes().await.expect("nodes")[0].draining);

    // Epochs are unique across nodes.
    let eb = store
        .register(&node("b"), LossReason::ServerRestarted)
        .await
        .expect("register b");
    assert!(eb > e2);

    // A stale leave changes nothing; the current one leaves, and the lease is then fenced.
    store.leave("a", e1).await.expect("stale leave");
    assert_eq!(
        store.nodes().await.expect("nodes")[0].state,
        NodeState::Live
    );
    store.leave("a", e2).await.expect("leave");
    assert_eq!(
        store.nodes().await.expect("nodes")[0].state,
        NodeState::Left
    );
    assert_eq!(
        store.renew("a", e2, 0).await.expect("renew"),
        Renewal::Fenced
    );
    postgres::drop_database(&url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_stops_renewing_expires_by_the_database_clock_and_its_sessions_are_lost() {
    let url = postgres::fresh_database();
    let store = Store::connect(&url).await.expect("connect");
    let ea = store
        .register(&node("a"), LossReason::ServerRestarted)
        .await
        .expect("a");
    // b's lease lasts 1 s past its renewals (its own row says so).
    let ttl = Duration::from_secs(1);
    let eb = store
        .register(&node_with_ttl("b", ttl), LossReason::ServerRestarted)
        .await
        .expect("b");
    // b holds a session with a root kernel and a child's.
    let on_b = claim_req("t", "s", "b", eb, None);
    assert!(matches!(
        store.claim(&on_b).await.expect("claim"),
        Claim::Claimed { .. }
    ));
    let b = Writer::new(&store, "b", eb);
    b.apply(vec![
        started("root", "t", "s", 3),
        started("kid", "t", "s::child::c1", 1),
    ])
    .await
    .expect("b's starts");
    // While b's lease is current, a claim from a is told to forward.
    let on_a = claim_req("t", "s", "a", ea, None);
    match store.claim(&on_a).await.expect("claim") {
        Claim::Held(p) => {
            assert_eq!(
                (p.node.as_str(), p.epoch, p.live, p.node_current),
                ("b", eb, true, true)
            );
            assert_eq!(p.advertise, "http://b.test:8080");
        }
        other => panic!("expected Held, got {other:?}"),
    }

    // a keeps renewing, b does not: poll the database until b's lease is older than the ttl.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert_eq!(
            store.renew("a", ea, 0).await.expect("renew a"),
            Renewal::Renewed
        );
        let nodes = store.nodes().await.expect("nodes");
        let age = nodes.iter().find(|n| n.name == "b").expect("b").lease_age;
        if age > ttl + Duration::from_millis(100) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "b's lease never aged past {ttl:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    store.renew("a", ea, 0).await.expect("renew a");
    let expired = store.expire_dead().await.expect("expire");
    assert_eq!(expired.len(), 1, "{expired:?}");
    assert_eq!(
        (
            expired[0].name.as_str(),
            expired[0].epoch,
            expired[0].kernels_lost
        ),
        ("b", eb, 2)
    );
    assert!(store.expire_dead().await.expect("expire again").is_empty());

    // b's row moved to a new epoch: its late renewal and its writes are fenced.
    let row = store
        .nodes()
        .await
        .expect("nodes")
        .into_iter()
        .find(|n| n.name == "b")
        .expect("b");
    assert_eq!(row.state, NodeState::Expired);
    assert!(row.epoch > eb);
    assert_eq!(
        store.renew("b", eb, 0).await.expect("late renew"),
        Renewal::Fenced
    );
    let refused = b.apply(vec![started("root", "t", "s", 4)]).await;
    assert!(
        matches!(refused, Err(CatalogError::Fenced { epoch, .. }) if epoch == eb),
        "{refused:?}"
    );

    // The session is not live and its node not current; a claims it and is owed the losses,
    // generations kept.
    let p = store
        .lookup("t", "s")
        .await
        .expect("lookup")
        .expect("a row");
    assert_eq!(
        (p.node.as_str(), p.live, p.node_current),
        ("b", false, false)
    );
    assert_eq!(store.tenant_live("t").await.expect("count"), 0);
    let got = entries(&store, &on_a).await;
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(lost_with(entry(&got, "root")), Some(LossReason::NodeLost));
    assert_eq!(entry(&got, "root").generation, 3);
    assert_eq!(entry(&got, "root").owner, "s");
    assert_eq!(lost_with(entry(&got, "kid")), Some(LossReason::NodeLost));
    assert_eq!(entry(&got, "kid").owner, "s::child::c1");
    let p = store
        .lookup("t", "s")
        .await
        .expect("lookup")
        .expect("a row");
    assert_eq!(
        (p.node.as_str(), p.epoch, p.live, p.node_current),
        ("a", ea, true, true)
    );
    postgres::drop_database(&url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_node_expires_by_the_lease_ttl_in_its_own_row_not_the_judges() {
    let url = postgres::fresh_database();
    let store = Store::connect(&url).await.expect("connect");
    // The judge renews against 1 s; "patient" registered a 60 s lease and "brief" a 1 s one.
    let short = Duration::from_secs(1);
    let judge = store
        .register(&node_with_ttl("judge", short), LossReason::ServerRestarted)
        .await
        .expect("judge");
    let patient = store
        .register(
            &node_with_ttl("patient", Duration::from_secs(60)),
            LossReason::ServerRestarted,
        )
        .await
        .expect("patient");
    let brief = store
        .register(&node_with_ttl("brief", short), LossReason::ServerRestarted)
        .await
        .expect("brief");
    let rows = store.nodes().await.expect("nodes");
    let ttl_of = |name: &str| rows.iter().find(|n| n.name == name).expect(name).lease_ttl;
    assert_eq!(ttl_of("patient"), Duration::from_secs(60));
    assert_eq!(ttl_of("brief"), short);
    // Neither patient nor brief renews: wait (by the database's clock) until both leases are
    // older than the judge's TTL.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert_eq!(
            store.renew("judge", judge, 0).await.expect("renew judge"),
            Renewal::Renewed
        );
        let nodes = store.nodes().await.expect("nodes");
        let age = |name: &str| nodes.iter().find(|n| n.name == name).expect(name).lease_age;
        if age("patient") > short + Duration::from_millis(100)
            && age("brief") > short + Duration::from_millis(100)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the leases never aged past {short:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Only brief's own TTL ran out; patient's 60 s lease stands, whatever the judge's is.
    let expired = store.expire_dead().await.expect("expire");
    let names: Vec<&str> = expired.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["brief"], "{expired:?}");
    assert_eq!(expired[0].epoch, brief);
    assert_eq!(
        store
            .renew("patient", patient, 0)
            .await
            .expect("renew patient"),
        Renewal::Renewed
    );
    assert_eq!(
        store.renew("brief", brief, 0).await.expect("late renew"),
        Renewal::Fenced
    );
    // Registering again stores the new TTL.
    store
        .register(
            &node_with_ttl("patient", short),
            LossReason::ServerRestarted,
        )
        .await
        .expect("patient again");
    let rows = store.nodes().await.expect("nodes");
    let row = rows.iter().find(|n| n.name == "patient").expect("patient");
    assert_eq!((row.lease_ttl, row.state), (short, NodeState::Live));
    postgres::drop_database(&url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_elsewhere_counts_live_root_kernels_on_the_other_current_nodes() {
    let url = postgres::fresh_database();
    let store = Store::connect(&url).await.expect("connect");
    let ea = store
        .register(&node("a"), LossReason::ServerRestarted)
        .await
        .expect("a");
    let eb = store
        .register(&node("b"), LossReason::ServerRestarted)
        .await
        .expect("b");
    for (tenant, session, name, epoch) in [
        ("t", "s1", "b", eb),
        ("t", "s2", "b", eb),
        ("u", "s3", "b", eb),
        ("t", "s4", "a", ea),
    ] {
        let claimed = store
            .claim(&claim_req(tenant, session, name, epoch, None))
            .await
            .expect("claim");
        assert!(matches!(claimed, Claim::Claimed { .. }), "{claimed:?}");
    }
    Writer::new(&store, "b", eb)
        .apply(vec![
            started("k1", "t", "s1", 1),
            started("k1c", "t", "s1::child::c1", 1),
            started("k2", "t", "s2", 1),
            started("k3", "u", "s3", 1),
        ])
        .await
        .expect("b's starts");
    Writer::new(&store, "a", ea)
        .apply(vec![started("k4", "t", "s4", 1)])
        .await
        .expect("a's start");
    // From a: b's root kernels, busiest tenant first; a child is not counted, nor a's own.
    assert_eq!(
        store.tenants_elsewhere("a").await.expect("count"),
        [("t".to_string(), 2), ("u".to_string(), 1)]
    );
    assert_eq!(
        store.tenants_elsewhere("b").await.expect("count"),
        [("t".to_string(), 1)]
    );
    // A node that left counts no more.
    store.leave("b", eb).await.expect("leave");
    assert!(store
        .tenants_elsewhere("a")
        .await
        .expect("count")
        .is_empty());
    postgres::drop_database(&url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_racing_on_a_first_call_one_claims_and_the_other_is_told_where() {
    let url = postgres::fresh_database();
    let store = Store::connect(&url).await.expect("connect");
    let ea = store
        .register(&node("a"), LossReason::ServerRestarted)
        .await
        .expect("a");
    let eb = store
        .register(&node("b"), LossReason::ServerRestarted)
        .await
        .expect("b");
    for i in 0..10 {
        let session = format!("race-{i}");
        let on_a = claim_req("t", &session, "a", ea, Some(100));
        let on_b = claim_req("t", &session, "b", eb, Some(100));
        let (ra, rb) = tokio::join!(store.claim(&on_a), store.claim(&on_b));
        let (ra, rb) = (ra.expect("a's claim"), rb.expect("b's claim"));
        let (winner, held) = match (&ra, &rb) {
            (Claim::Claimed { entries }, Claim::Held(p)) if entries.is_empty() => ("a", p),
            (Claim::Held(p), Claim::Claimed { entries }) if entries.is_empty() => ("b", p),
            other => panic!("expected one Claimed and one Held, got {other:?}"),
        };
        assert_eq!(held.node, winner);
        assert!(held.live && held.node_current);
        let p = store
            .lookup("t", &session)
            .await
            .expect("lookup")
            .expect("row");
        assert_eq!(p.node, winner);
    }
    assert_eq!(store.tenant_live("t").await.expect("count"), 10);
    postgres::drop_database(&url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_cap_counts_live_sessions_on_every_node() {
    let url = postgres::fresh_database();
    let store = Store::connect(&url).await.expect("connect");
    let ea = store
        .register(&node("a"), LossReason::ServerRestarted)
        .await
        .expect("a");
    let eb = store
        .register(&node("b"), LossReason::ServerRestarted)
        .await
        .expect("b");
    let cap = Some(2);
    let claimed = |c: Claim| matches!(c, Claim::Claimed { .. });
    assert!(claimed(
        store
            .claim(&claim_req("t", "s1", "a", ea, cap))
            .await
            .expect("s1")
    ));
    assert!(claimed(
        store
            .claim(&claim_req("t", "s2", "b", eb, cap))
            .await
            .expect("s2")
    ));
    assert_eq!(
        store
            .claim(&claim_req("t", "s3", "a", ea, cap))
            .await
            .expect("s3"),
        Claim::TenantAtCap { live: 2 }
    );
    assert_eq!(
        store
            .claim(&claim_req("t", "s3", "b", eb, cap))
            .await
            .expect("s3"),
        Claim::TenantAtCap { live: 2 }
    );
    // A session already here is not counted against itself; other tenants are not affected.
    assert!(claimed(
        store
            .claim(&claim_req("t", "s1", "a", ea, cap))
            .await
            .expect("s1 again")
    ));
    assert!(claimed(
        store
            .claim(&claim_req("u", "s1", "a", ea, cap))
            .await
            .expect("u")
    ));
    assert_eq!(store.tenant_live("t").await.expect("count"), 2);
    assert!(store.lookup("t", "s3").await.expect("lookup").is_none());

    // s1's root kernel starts, then ends on purpose: the session is no longer live, and s3 fits.
    let a = Writer::new(&store, "a", ea);
    a.apply(vec![started("k1", "t", "s1", 1)])
        .await
        .expect("start");
    a.apply(vec![Change::Ended {
        key_hash: "k1".into(),
    }])
    .await
    .expect("end");
    assert!(
        !store
            .lookup("t", "s1")
            .await
            .expect("lookup")
            .expect("row")
            .live
    );
    assert_eq!(store.tenant_live("t").await.expect("count"), 1);
    assert!(claimed(
        store
            .claim(&claim_req("t", "s3", "b", eb, cap))
            .await
            .expect("s3")
    ));
    assert_eq!(store.tenant_live("t").await.expect("count"), 2);

    // A fenced claimant is told so before anything else.
    let stale = claim_req("t", "s4", "a", ea - 1, cap);
    assert_eq!(store.claim(&stale).await.expect("stale"), Claim::Fenced);
    postgres::drop_database(&url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_keeps_its_rules_and_a_claim_returns_the_loss_and_the_generation() {
    let url = postgres::fresh_database();
    let store = Store::connect(&url).await.expect("connect");
    let ea = store
        .register(&node("a"), LossReason::ServerRestarted)
        .await
        .expect("a");
    let eb = store
        .register(&node("b"), LossReason::ServerRestarted)
        .await
        .expect("b");
    let a = Writer::new(&store, "a", ea);
    assert!(a.catalog.load().expect("load").is_empty());
    let on_a = claim_req("t", "s", "a", ea, None);
    assert!(matches!(
        store.claim(&on_a).await.expect("claim"),
        Claim::Claimed { .. }
    ));

    // The root's start makes the session live here; generations only grow.
    a.apply(vec![
        started("root", "t", "s", 5),
        started("root", "t", "s", 2),
    ])
    .await
    .expect("starts");
    let got = entries(&store, &on_a).await;
    assert_eq!(entry(&got, "root").generation, 5);
    assert_eq!(entry(&got, "root").state, EntryState::Live);
    // A loss, then an end: the end does not overwrite the loss, which keeps its time.
    a.apply(vec![
        lost("root", "t", "s", 5, LossReason::Oom),
        Change::Ended {
            key_hash: "root".into(),
        },
    ])
    .await
    .expect("loss");
    let p = store.lookup("t", "s").await.expect("lookup").expect("row");
    assert!(!p.live, "a root's loss makes its session not live");

    // Claimed on b (the session is not live): b is owed the loss, with its time, and the
    // generation.
    let on_b = claim_req("t", "s", "b", eb, None);
    let got = entries(&store, &on_b).await;
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0],
        Entry {
            key_hash: "root".into(),
            tenant: "t".into(),
            owner: "s".into(),
            generation: 5,
            state: EntryState::Lost {
                loss: loss(LossReason::Oom)
            },
        }
    );
    // a's writes no longer touch the key b now holds; b's start overwrites the loss.
    let b = Writer::new(&store, "b", eb);
    b.apply(vec![started("root", "t", "s", 6)])
        .await
        .expect("b starts");
    a.apply(vec![
        lost("root", "t", "s", 9, LossReason::Evicted),
        Change::Ended {
            key_hash: "root".into(),
        },
    ])
    .await
    .expect("a's stale changes");
    let got = entries(&store, &on_b).await;
    assert_eq!(entry(&got, "root").state, EntryState::Live);
    assert_eq!(entry(&got, "root").generation, 6);
    let p = store.lookup("t", "s").await.expect("lookup").expect("row");
    assert_eq!((p.node.as_str(), p.live), ("b", true));
    postgres::drop_database(&url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_writes_for_a_stale_epoch_change_nothing() {
    let url = postgres::fresh_database();
    let store = Store::connect(&url).await.expect("connect");
    let e1 = store
        .register(&node("a"), LossReason::ServerRestarted)
        .await
        .expect("a");
    let a = Writer::new(&store, "a", e1);
    let e2 = store
        .register(&node("a"), LossReason::ServerRestarted)
        .await
        .expect("again");
    let refused = a.apply(vec![started("k", "t", "s", 1)]).await;
    assert!(
        matches!(&refused, Err(CatalogError::Fenced { node, epoch }) if node == "a" && *epoch == e1),
        "{refused:?}"
    );
    assert!(store.lookup("t", "s").await.expect("lookup").is_none());
    let raw = postgres::raw(&url).await;
    let rows: i64 = raw
        .query_one("SELECT count(*) FROM kb_kernels", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(rows, 0);
    // The lease loop stores the new epoch: writes go through again.
    a.epoch.store(e2, Ordering::Release);
    a.apply(vec![started("k", "t", "s", 1)])
        .await
        .expect("current epoch");
    let p = store.lookup("t", "s").await.expect("lookup").expect("row");
    assert_eq!(
        (p.node.as_str(), p.epoch, p.live, p.node_current),
        ("a", e2, true, true)
    );
    postgres::drop_database(&url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_live_lost_is_this_nodes_and_registering_again_loses_the_previous_epochs_kernels() {
    let url = postgres::fresh_database();
    let store = Store::connect(&url).await.expect("connect");
    let ea = store
        .register(&node("a"), LossReason::ServerRestarted)
        .await
        .expect("a");
    let eb = store
        .register(&node("b"), LossReason::ServerRestarted)
        .await
        .expect("b");
    let (a, b) = (Writer::new(&store, "a", ea), Writer::new(&store, "b", eb));
    for (w, name, epoch, session) in [(&a, "a", ea, "sa"), (&b, "b", eb, "sb")] {
        let req = claim_req("t", session, name, epoch, None);
        assert!(matches!(
            store.claim(&req).await.expect("claim"),
            Claim::Claimed { .. }
        ));
        w.apply(vec![
            started(&format!("{session}-root"), "t", session, 1),
            started(
                &format!("{session}-kid"),
                "t",
                &format!("{session}::child::c"),
                1,
            ),
        ])
        .await
        .expect("starts");
    }
    assert_eq!(store.tenant_live("t").await.expect("count"), 2);

    a.apply(vec![Change::AllLiveLost {
        loss: loss(LossReason::ServerRestarted),
    }])
    .await
    .expect("a's shutdown");
    let got = entries(&store, &claim_req("t", "sa", "a", ea, None)).await;
    assert!(
        got.iter()
            .all(|e| lost_with(e) == Some(LossReason::ServerRestarted)),
        "{got:?}"
    );
    let got = entries(&store, &claim_req("t", "sb", "b", eb, None)).await;
    assert!(
        got.iter().all(|e| e.state == EntryState::Live),
        "b's rows untouched: {got:?}"
    );
    assert!(
        store
            .lookup("t", "sb")
            .await
            .expect("lookup")
            .expect("row")
            .live
    );

    // b restarts: its previous epoch's live kernels are lost server_restarted, its session
    // is not live; the new epoch starts clean.
    let eb2 = store
        .register(&node("b"), LossReason::ServerRestarted)
        .await
        .expect("b again");
    assert!(eb2 > eb);
    let p = store.lookup("t", "sb").await.expect("lookup").expect("row");
    assert_eq!((p.live, p.node_current), (false, false));
    let got = entries(&store, &claim_req("t", "sb", "b", eb2, None)).await;
    assert_eq!(got.len(), 2);
    for e in &got {
        match &e.state {
            EntryState::Lost { loss } => {
                assert_eq!(loss.reason, LossReason::ServerRestarted);
                humantime::parse_rfc3339(&loss.at).expect("RFC 3339");
            }
            other => panic!("expected a loss, got {other:?}"),
        }
    }
    postgres::drop_database(&url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_rows_past_its_bound_go_oldest_first_and_live_rows_stay() {
    let url = postgres::fresh_database();
    let store = Store::connect(&url).await.expect("connect");
    let ea = store
        .register(&node("a"), LossReason::ServerRestarted)
        .await
        .expect("a");
    let a = Writer::new(&store, "a", ea);
    let catalog = a.catalog.clone().with_tenant_bound(3);
    let a = Writer {
        catalog,
        epoch: a.epoch,
    };
    // Two live rows, then three ended ones: one row too many, the oldest ended goes.
    a.apply(vec![
        started("live1", "t", "s1", 1),
        started("live2", "t", "s2", 1),
    ])
    .await
    .expect("live");
    for key in ["old", "mid", "new"] {
        a.apply(vec![
            started(key, "t", key, 1),
            Change::Ended {
                key_hash: key.into(),
            },
        ])
        .await
        .expect("ended");
    }
    a.apply(vec![started("other", "u", "s", 1)])
        .await
        .expect("another tenant");
    let raw = postgres::raw(&url).await;
    let keys: Vec<String> = raw
        .query(
            "SELECT key_hash FROM kb_kernels WHERE tenant = 't' ORDER BY key_hash",
            &[],
        )
        .await
        .expect("rows")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(keys, ["live1", "live2", "new"]);
    postgres::drop_database(&url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_fails_in_time_and_the_error_hides_the_password() {
    // Nothing listens on port 1 of loopback.
    let started = Instant::now();
    let err = Store::connect("postgres://kb:hunter2secret@127.0.0.1:1/kb")
        .await
        .expect_err("no database");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let text = format!("{err} {err:?}");
    assert!(!text.contains("hunter2secret"), "{text}");
    assert!(text.contains("kb@127.0.0.1:1/kb"), "{text}");
    let err = Store::connect("mysql://x").await.expect_err("not postgres");
    assert!(err.to_string().contains("not a PostgreSQL URL"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_live_on_a_node_that_is_no_longer_current_is_taken_over() {
    let url = postgres::fresh_database();
    let store = Store::connect(&url).await.expect("connect");
    let ea = store
        .register(&node("a"), LossReason::ServerRestarted)
        .await
        .expect("a");
    let eb = store
        .register(&node("b"), LossReason::ServerRestarted)
        .await
        .expect("b");
    let b = Writer::new(&store, "b", eb);
    let on_b = claim_req("t", "s", "b", eb, None);
    assert!(matches!(
        store.claim(&on_b).await.expect("claim"),
        Claim::Claimed { .. }
    ));
    b.apply(vec![started("root", "t", "s", 2)])
        .await
        .expect("b starts");
    // b's row stops being current behind the store's back (as a node row an operator edited,
    // or a version that did not clear its sessions): its session and kernel still say live.
    let raw = postgres::raw(&url).await;
    raw.execute("UPDATE kb_nodes SET state = 'left' WHERE name = 'b'", &[])
        .await
        .expect("b left");
    let p = store.lookup("t", "s").await.expect("lookup").expect("row");
    assert_eq!((p.live, p.node_current), (true, false));
    assert_eq!(store.tenant_live("t").await.expect("count"), 0);
    let got = entries(&store, &claim_req("t", "s", "a", ea, Some(1))).await;
    assert_eq!(lost_with(entry(&got, "root")), Some(LossReason::NodeLost));
    assert_eq!(entry(&got, "root").generation, 2);
    let p = store.lookup("t", "s").await.expect("lookup").expect("row");
    assert_eq!((p.node.as_str(), p.node_current), ("a", true));
    postgres::drop_database(&url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_usage_ledger_sums_rows_of_every_node_reads_ranges_and_prunes() {
    use kernelbox::usage::UsageRow;
    let url = postgres::fresh_database();
    let store = Store::connect(&url).await.expect("connect");
    let (a, b) = (Writer::new(&store, "n1", 1), Writer::new(&store, "n2", 1));
    let row = |tenant: &str, start: u64, cells: u64, peak: u64| UsageRow {
        tenant: tenant.into(),
        session: "s".into(),
        start,
        cells,
        cpu_seconds: 0.5,
        peak_memory_bytes: peak,
        network_bytes_in: 1_000 * cells,
        network_bytes_out: cells,
        ..UsageRow::default()
    };
    let add = |w: &Writer, rows: Vec<UsageRow>, keep_from: u64| {
        let catalog = w.catalog.clone();
        tokio::task::spawn_blocking(move || catalog.add_usage(&rows, keep_from))
    };
    add(&a, vec![row("t", 3_600, 1, 10), row("u", 3_600, 7, 1)], 0)
        .await
        .expect("thread")
        .expect("add");
    add(&b, vec![row("t", 3_600, 2, 30), row("t", 7_200, 4, 5)], 0)
        .await
        .expect("thread")
        .expect("add");
    let read = |tenant: Option<&'static str>, from: u64, to: u64| {
        let catalog = a.catalog.clone();
        tokio::task::spawn_blocking(move || catalog.usage(tenant, from, to))
    };
    let t = read(Some("t"), 0, 7_200)
        .await
        .expect("thread")
        .expect("read");
    assert_eq!(t.len(), 1, "{t:?}");
    assert_eq!((t[0].cells, t[0].peak_memory_bytes), (3, 30));
    assert_eq!((t[0].network_bytes_in, t[0].network_bytes_out), (3_000, 3));
    assert!((t[0].cpu_seconds - 1.0).abs() < 1e-9);
    assert_eq!(
        read(None, 0, 10_800)
            .await
            .expect("thread")
            .expect("read")
            .len(),
        3
    );
    add(&a, vec![], 7_200)
        .await
        .expect("thread")
        .expect("prune");
    let left = read(None, 0, 10_800).await.expect("thread").expect("read");
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!((left[0].start, left[0].cells), (7_200, 4));
    postgres::drop_database(&url);
}

/// Sessions' own policies and settings in the catalog (docs/cluster.md, "Session policies and
/// settings"): bounded in bytes per tenant and field, refused for a session live on another
/// node, each write and read a greater version, forgotten with the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_config_is_bounded_per_tenant_refused_where_held_elsewhere_and_versioned() {
    use kernelbox::cluster::{ConfigField, ConfigWrite};
    let url = postgres::fresh_database();
    let store = Store::connect(&url).await.expect("connect");
    let ea = store
        .register(&node("a"), LossReason::ServerRestarted)
        .await
        .expect("register a");
    store
        .register(&node("b"), LossReason::ServerRestarted)
        .await
        .expect("register b");
    let put = |session: &'static str, field: ConfigField<'static>| {
        let store = store.clone();
        async move {
            store
                .put_session_config("t", session, "b", field, 1_000)
                .await
                .expect("write")
        }
    };
    let v1 = match put("s1", ConfigField::Network(Some(r#"{"allow":[]}"#), 600)).await {
        ConfigWrite::Written { version } => version,
        other => panic!("expected Written, got {other:?}"),
    };
    // The tenant's network policies would pass 1,000 bytes; its settings have their own room;
    // another tenant is not counted.
    assert_eq!(
        put("s2", ConfigField::Network(Some(r#"{"allow":[]}"#), 600)).await,
        ConfigWrite::TooMany
    );
    assert!(matches!(
        put(
            "s2",
            ConfigField::Settings(Some(r#"{"env":{"A":"1"}}"#), 600)
        )
        .await,
        ConfigWrite::Written { .. }
    ));
    assert!(matches!(
        store
            .put_session_config("u", "s2", "b", ConfigField::Network(Some("{}"), 900), 1_000)
            .await
            .expect("write"),
        ConfigWrite::Written { .. }
    ));
    // A read has a greater version than every earlier write, and says what was written.
    let read = store.load_session_config("t", "s1").await.expect("read");
    assert!(read.version > v1);
    assert_eq!(read.network.as_deref(), Some(r#"{"allow":[]}"#));
    assert_eq!(read.settings, None);
    // A session live on node a is written by a only.
    store
        .claim(&claim_req("t", "s3", "a", ea, None))
        .await
        .expect("claim");
    assert!(matches!(
        put("s3", ConfigField::Settings(Some("{}"), 10)).await,
        ConfigWrite::Held(p) if p.node == "a"
    ));
    // Forgetting the session gives its bytes back.
    store
        .forget_session_config("t", "s1")
        .await
        .expect("forget");
    assert!(matches!(
        put("s2", ConfigField::Network(Some(r#"{"allow":[]}"#), 600)).await,
        ConfigWrite::Written { .. }
    ));
    let read = store.load_session_config("t", "s1").await.expect("read");
    assert_eq!((read.network, read.settings), (None, None));
}
