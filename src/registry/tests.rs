use super::*;
use crate::catalog::{Entry, EntryState};
use crate::config::WorkMode;
use std::collections::BTreeSet;

fn tkey(tenant: &str, session: &str, child: Option<&str>) -> KernelKey {
    KernelKey {
        owner: Owner::new(tenant, session, child).unwrap(),
        mode: WorkMode::Strict,
        image: "img".into(),
        tools: BTreeSet::new(),
        runtime: Default::default(),
        context: Default::default(),
    }
}

fn key(session: &str, child: Option<&str>) -> KernelKey {
    tkey("t", session, child)
}

/// Attaches with no tenant limits; the attach must be admitted.
fn att(reg: &Registry, k: &KernelKey) -> Attach {
    reg.attach(k, false, TenantLimits::default())
        .expect("admitted")
}

fn at_cap(r: Result<Attach, Refusal>) -> AtCapacity {
    match r {
        Err(Refusal::AtCapacity(full)) => full,
        other => panic!("expected a refusal at a cap, got {other:?}"),
    }
}

fn use_once(reg: &Registry, k: &KernelKey) -> Attach {
    let a = att(reg, k);
    assert!(!reg.release(&a.slot));
    a
}

/// Attaches and releases at once (an idle kernel), with limits; returns the evicted
/// owners.
async fn idle_kernel(reg: &Registry, k: &KernelKey, limits: TenantLimits) -> Vec<String> {
    tokio::time::advance(Duration::from_millis(10)).await;
    let a = reg.attach(k, false, limits).expect("admitted");
    assert!(!reg.release(&a.slot));
    a.victims.iter().map(|s| s.key.owner.to_string()).collect()
}

fn held(reg: &Registry, tenant: &str) -> usize {
    reg.slots()
        .iter()
        .filter(|s| s.key.owner.tenant == tenant)
        .count()
}

#[tokio::test(start_paused = true)]
async fn idle_slots_are_reaped_by_a_pass_or_any_acquire_but_not_when_attached() {
    let reg = Registry::new(4, Duration::from_secs(1));
    use_once(&reg, &key("idle", None));
    let busy = att(&reg, &key("busy", None));
    tokio::time::advance(Duration::from_millis(500)).await;
    assert!(reg.reap_idle().0.is_empty(), "fresh kernels survive a pass");
    tokio::time::advance(Duration::from_millis(600)).await;
    let reaped: Vec<_> = reg
        .reap_idle()
        .0
        .iter()
        .map(|s| s.key.owner.session.clone())
        .collect();
    assert_eq!(reaped, vec!["idle"]);
    assert_eq!(reg.len(), 1, "the attached kernel is spared");
    // Reaped by another owner's acquire too.
    reg.release(&busy.slot);
    tokio::time::advance(Duration::from_secs(2)).await;
    let other = att(&reg, &key("other", None));
    assert_eq!(other.victims.len(), 1);
    let back = att(&reg, &key("idle", None));
    assert_eq!(
        back.state_lost.map(|l| l.reason),
        Some(LossReason::IdleReaped)
    );
}

#[tokio::test(start_paused = true)]
async fn lru_cap_evicts_least_recently_used_unattached() {
    let reg = Registry::new(2, Duration::from_secs(3600));
    let keys: Vec<_> = (0..4).map(|i| key(&format!("conv-{i}"), None)).collect();
    let mut evicted = Vec::new();
    for k in &keys {
        tokio::time::advance(Duration::from_millis(10)).await;
        evicted.extend(
            use_once(&reg, k)
                .victims
                .into_iter()
                .map(|s| s.key.owner.session.clone()),
        );
    }
    assert_eq!(evicted, vec!["conv-0", "conv-1"]);
    let live: BTreeSet<_> = reg
        .slots()
        .iter()
        .map(|s| s.key.owner.session.clone())
        .collect();
    assert_eq!(
        live,
        BTreeSet::from(["conv-2".to_string(), "conv-3".to_string()])
    );
    // The evicted key reports its loss once.
    let again = att(&reg, &keys[0]);
    assert_eq!(
        again.state_lost.map(|l| l.reason),
        Some(LossReason::Evicted)
    );
    assert_eq!(again.slot.generation(), 2);
    reg.release(&again.slot);
    assert!(att(&reg, &keys[0]).state_lost.is_none());
}

#[tokio::test(start_paused = true)]
async fn the_host_cap_is_hard_for_attached_slots_and_children_are_outside_it() {
    let reg = Registry::new(1, Duration::from_secs(3600));
    let busy = att(&reg, &key("busy", None));
    tokio::time::advance(Duration::from_millis(10)).await;
    // A burst cannot pass the cap: the attached kernel cannot go, so the next is refused
    // and nothing is registered for it.
    let refused = at_cap(reg.attach(&key("other", None), false, TenantLimits::default()));
    assert_eq!(refused.cap, Cap::Host { max: 1, share: 1 });
    assert_eq!(refused.held, 1);
    assert!(refused.victims.is_empty());
    assert_eq!(reg.len(), 1);
    // Live delegated children are pinned: admitted past the cap, never evicted, within a
    // pool of their own as large as the cap.
    let a = use_once(&reg, &key("conv", Some("child-0")));
    assert!(a.victims.is_empty(), "children are pinned");
    let refused = at_cap(reg.attach(
        &key("conv", Some("child-1")),
        false,
        TenantLimits::default(),
    ));
    assert_eq!(refused.cap, Cap::Children { max: 1 });
    assert_eq!(reg.len(), 2);
    // A released child counts again and is the first to go.
    reg.release_child(&Owner::new("t", "conv", Some("child-0")).unwrap());
    assert!(!reg.release(&busy.slot));
    let next = att(&reg, &key("next", None));
    let gone: BTreeSet<_> = next
        .victims
        .iter()
        .map(|s| s.key.owner.to_string())
        .collect();
    assert_eq!(
        gone,
        BTreeSet::from(["conv::child::child-0".to_string(), "busy".to_string()])
    );
    assert_eq!(reg.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_cleared_slot_is_handed_back_for_disposal_even_when_attached() {
    let reg = Registry::new(4, Duration::from_secs(3600));
    let a = att(&reg, &key("s", None));
    let (count, removed) = reg.remove_where(|o| o.session == "s", None, false);
    assert_eq!(count, 1);
    assert!(
        removed.len() == 1 && Arc::ptr_eq(&removed[0], &a.slot),
        "attached or not, a removed slot is disposed of at once"
    );
    assert!(!reg.is_registered(&a.slot));
    assert!(reg.release(&a.slot), "the last call out disposes too");
}

#[tokio::test(start_paused = true)]
async fn releasing_children_that_have_no_kernel_records_nothing() {
    let reg = Registry::new(4, Duration::from_secs(3600));
    for i in 0..80_000 {
        reg.release_child(&Owner::new("t", "s", Some(&format!("never-{i}"))).unwrap());
    }
    assert_eq!(reg.released_children(), 0);
    // A live child's mark lasts as long as its slot.
    let child = key("s", Some("c"));
    use_once(&reg, &child);
    reg.release_child(&child.owner);
    assert_eq!(reg.released_children(), 1);
    reg.remove_where(|o| o.child.as_deref() == Some("c"), None, false);
    assert_eq!(reg.released_children(), 0);
}

#[tokio::test(start_paused = true)]
async fn live_children_have_a_host_wide_pool_as_large_as_the_cap() {
    let reg = Registry::new(2, Duration::from_secs(3600));
    for i in 0..2 {
        use_once(&reg, &tkey("a", "s", Some(&format!("c{i}"))));
    }
    // Pinned children are never evicted: a third is refused, from any tenant.
    let refused = at_cap(reg.attach(&tkey("b", "s", Some("c")), false, TenantLimits::default()));
    assert_eq!(refused.cap, Cap::Children { max: 2 });
    assert_eq!(refused.held, 0);
    assert_eq!(reg.len(), 2);
    // Sessions still have the host's cap of their own.
    use_once(&reg, &tkey("b", "s", None));
    use_once(&reg, &tkey("b", "t", None));
    assert_eq!(reg.len(), 4);
    // A released child leaves the pool.
    reg.release_child(&tkey("a", "s", Some("c0")).owner);
    use_once(&reg, &tkey("b", "s", Some("c")));
}

#[tokio::test(start_paused = true)]
async fn at_most_max_attached_calls_per_slot() {
    let reg = Registry::new(4, Duration::from_secs(3600));
    let k = key("s", None);
    let held: Vec<Attach> = (0..MAX_ATTACHED_PER_SLOT).map(|_| att(&reg, &k)).collect();
    match reg.attach(&k, false, TenantLimits::default()) {
        Err(Refusal::Busy { owner, max }) => {
            assert_eq!((owner.as_str(), max), ("s", MAX_ATTACHED_PER_SLOT));
        }
        other => panic!("expected busy, got {other:?}"),
    }
    // A reset replaces the slot (the old one is disposed of by the caller).
    let fresh = reg.attach(&k, true, TenantLimits::default()).unwrap();
    assert!(fresh.reset.is_some());
    for a in &held {
        reg.release(&a.slot);
    }
    assert!(!reg.release(&fresh.slot));
    assert!(reg.attach(&k, false, TenantLimits::default()).is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_tenant_cap_evicts_its_own_idle_kernels_then_refuses() {
    let reg = Registry::new(100, Duration::from_secs(3600));
    let other = use_once(&reg, &key("other-tenant", None));
    let capped = TenantLimits {
        max_kernels: Some(2),
        reserved: None,
        hibernate: false,
    };
    let (k1, k2, k3) = (
        tkey("t2", "a", None),
        tkey("t2", "b", None),
        tkey("t2", "c", None),
    );
    let a = reg.attach(&k1, false, capped).unwrap();
    reg.release(&a.slot);
    tokio::time::advance(Duration::from_millis(5)).await;
    let b = reg.attach(&k2, false, capped).unwrap();
    // At the cap with `a` idle: `a` goes, not another tenant's kernel.
    let c = reg.attach(&k3, false, capped).unwrap();
    let gone: Vec<_> = c
        .victims
        .iter()
        .map(|s| s.key.owner.session.clone())
        .collect();
    assert_eq!(gone, vec!["a"]);
    assert!(reg.slots().iter().any(|s| Arc::ptr_eq(s, &other.slot)));
    // Both remaining kernels busy: refused, naming the tenant's cap.
    let refused = at_cap(reg.attach(&k1, false, capped));
    assert_eq!(refused.cap, Cap::Tenant { max: 2 });
    assert_eq!(refused.held, 2);
    assert_eq!(reg.eviction_counts().tenant_cap, 1);
    reg.release(&b.slot);
    reg.release(&c.slot);
}

#[tokio::test(start_paused = true)]
async fn a_tenant_within_its_fair_share_is_never_evicted_by_another() {
    let none = TenantLimits::default();
    let reg = Registry::new(4, Duration::from_secs(3600));
    // A fills the host with idle kernels.
    for i in 0..4 {
        assert!(idle_kernel(&reg, &tkey("a", &format!("a{i}"), None), none)
            .await
            .is_empty());
    }
    // B's new kernels take A's least recently used while A holds more than its share
    // (4 / 2 tenants = 2) and B less than its own.
    assert_eq!(
        idle_kernel(&reg, &tkey("b", "b0", None), none).await,
        vec!["a0"]
    );
    assert_eq!(
        idle_kernel(&reg, &tkey("b", "b1", None), none).await,
        vec!["a1"]
    );
    // A is at its share: B's next new kernel costs B its own least recently used one.
    assert_eq!(
        idle_kernel(&reg, &tkey("b", "b2", None), none).await,
        vec!["b0"]
    );
    assert_eq!((held(&reg, "a"), held(&reg, "b")), (2, 2));
    // B's kernels all busy: refused, naming the host's cap and B's share; nobody evicted.
    let b1 = reg.attach(&tkey("b", "b1", None), false, none).unwrap();
    let b2 = reg.attach(&tkey("b", "b2", None), false, none).unwrap();
    let refused = at_cap(reg.attach(&tkey("b", "b3", None), false, none));
    assert_eq!(refused.cap, Cap::Host { max: 4, share: 2 });
    assert_eq!(refused.held, 2);
    assert_eq!((held(&reg, "a"), held(&reg, "b")), (2, 2));
    // A, within its share, may use its own room again at once.
    assert!(idle_kernel(&reg, &tkey("a", "a2", None), none)
        .await
        .is_empty());
    reg.release(&b1.slot);
    reg.release(&b2.slot);
    let counts = reg.eviction_counts();
    assert_eq!((counts.host_cap_other, counts.host_cap_own), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn the_remainder_of_an_uneven_share_does_not_bounce_between_tenants() {
    let none = TenantLimits::default();
    let reg = Registry::new(5, Duration::from_secs(3600));
    for i in 0..3 {
        idle_kernel(&reg, &tkey("a", &format!("a{i}"), None), none).await;
    }
    for i in 0..2 {
        idle_kernel(&reg, &tkey("b", &format!("b{i}"), None), none).await;
    }
    // Shares are 5 / 2 = 2 (rounded down). B at its share takes its own; so does A,
    // above its share: neither takes the other's.
    assert_eq!(
        idle_kernel(&reg, &tkey("b", "b2", None), none).await,
        vec!["b0"]
    );
    assert_eq!(
        idle_kernel(&reg, &tkey("a", "a3", None), none).await,
        vec!["a0"]
    );
    assert_eq!((held(&reg, "a"), held(&reg, "b")), (3, 2));
    // A newcomer's share is 5 / 3 = 1: it takes from the least recently used of the
    // tenants above their share (A's a1, older than B's b1).
    assert_eq!(
        idle_kernel(&reg, &tkey("c", "c0", None), none).await,
        vec!["a1"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_reservation_overrides_the_fair_share() {
    let none = TenantLimits::default();
    let reserved = TenantLimits {
        max_kernels: None,
        reserved: Some(3),
        hibernate: false,
    };
    let reg = Registry::new(4, Duration::from_secs(3600));
    for i in 0..4 {
        idle_kernel(&reg, &tkey("a", &format!("a{i}"), None), reserved).await;
    }
    // A keeps 3; B's share is what is left (1).
    assert_eq!(
        idle_kernel(&reg, &tkey("b", "b0", None), none).await,
        vec!["a0"]
    );
    assert_eq!(
        idle_kernel(&reg, &tkey("b", "b1", None), none).await,
        vec!["b0"]
    );
    assert_eq!((held(&reg, "a"), held(&reg, "b")), (3, 1));
    // Without the reservation A's share would be 2 and B would take one more.
    let reg = Registry::new(4, Duration::from_secs(3600));
    for i in 0..4 {
        idle_kernel(&reg, &tkey("a", &format!("a{i}"), None), none).await;
    }
    idle_kernel(&reg, &tkey("b", "b0", None), none).await;
    assert_eq!(
        idle_kernel(&reg, &tkey("b", "b1", None), none).await,
        vec!["a1"]
    );
}

#[tokio::test(start_paused = true)]
async fn seeded_keys_take_their_generation_and_owed_loss_once_and_only_for_their_owner() {
    use crate::catalog::{Catalog, CatalogWriter, MemoryCatalog};
    let catalog = Arc::new(MemoryCatalog::default());
    let writer = Arc::new(CatalogWriter::start(catalog.clone()).expect("writer"));
    let lost = StateLost {
        reason: LossReason::ServerRestarted,
        at: "2026-01-01T00:00:00Z".into(),
        workspace_lost: false,
    };
    let k = key("s", None);
    let mut forged = key("forged", None);
    let entries = vec![
        Entry {
            key_hash: k.hash(),
            tenant: "t".into(),
            owner: "s".into(),
            generation: 4,
            state: EntryState::Lost { loss: lost.clone() },
        },
        // A row whose owner does not match its hash is never handed to the key.
        Entry {
            key_hash: forged.hash(),
            tenant: "other".into(),
            owner: "forged".into(),
            generation: 9,
            state: EntryState::Lost { loss: lost.clone() },
        },
    ];
    let reg = Registry::new(4, Duration::from_secs(3600));
    assert_eq!(reg.use_catalog(writer.clone(), entries), 2);
    let a = use_once(&reg, &k);
    assert_eq!(a.state_lost, Some(lost));
    assert_eq!(a.slot.generation(), 5);
    forged.owner.tenant = "t".into();
    let f = att(&reg, &forged);
    assert_eq!(f.state_lost, None);
    assert_eq!(f.slot.generation(), 1);
    // Losses are recorded; a slot drained at shutdown records nothing.
    assert!(reg.forget(&a.slot, Some(LossReason::Oom)));
    reg.drain();
    assert!(!reg.forget(&f.slot, Some(LossReason::Oom)));
    writer.close();
    let rows = catalog.load().expect("load");
    assert_eq!(rows.len(), 1, "only the loss before closing: {rows:?}");
    assert!(rows.iter().any(|r| r.key_hash == k.hash()
        && matches!(&r.state, EntryState::Lost { loss } if loss.reason == LossReason::Oom)));
}

#[tokio::test(start_paused = true)]
async fn reset_discards_the_slot_and_bumps_the_generation() {
    let reg = Registry::new(4, Duration::from_secs(3600));
    let k = key("s", None);
    let first = use_once(&reg, &k);
    let second = reg.attach(&k, true, TenantLimits::default()).unwrap();
    assert!(second.reset.is_some_and(|s| Arc::ptr_eq(&s, &first.slot)));
    assert_eq!(second.slot.generation(), 2);
    assert!(
        second.state_lost.is_none(),
        "a reset is not an involuntary loss"
    );
}

#[tokio::test(start_paused = true)]
async fn one_tenants_churn_never_makes_the_registry_forget_another_tenants_owed_loss() {
    let reg = Registry::new(4, Duration::from_secs(3600));
    let b = tkey("b", "victim", None);
    let first = att(&reg, &b);
    assert!(reg.forget(&first.slot, Some(LossReason::Evicted)));
    // Tenant a churns through more session names than the registry remembers in all, each
    // with a loss owed.
    for i in 0..MAX_REMEMBERED_KEYS + 10 {
        let a = att(&reg, &tkey("a", &format!("s{i}"), None));
        assert!(reg.forget(&a.slot, Some(LossReason::IdleReaped)));
    }
    let again = att(&reg, &b);
    assert_eq!(
        again.state_lost.map(|l| l.reason),
        Some(LossReason::Evicted),
        "b's owed loss survived a's churn"
    );
    assert_eq!(again.slot.generation(), 2);
    // a's own bound applies to a: its oldest keys are forgotten, its newest are not.
    let oldest = att(&reg, &tkey("a", "s0", None));
    assert_eq!(oldest.state_lost, None);
    assert_eq!(oldest.slot.generation(), 1);
    let newest = att(
        &reg,
        &tkey("a", &format!("s{}", MAX_REMEMBERED_KEYS + 9), None),
    );
    assert_eq!(
        newest.state_lost.map(|l| l.reason),
        Some(LossReason::IdleReaped)
    );
    let inner = reg.lock();
    assert!(inner.remembered_total <= MAX_REMEMBERED_KEYS);
    assert!(inner.remembered["a"].len() <= MAX_REMEMBERED_PER_TENANT);
}

#[tokio::test(start_paused = true)]
async fn a_claimed_session_takes_the_clusters_generation_and_loss_over_what_this_node_remembered() {
    let reg = Registry::new(4, Duration::from_secs(3600));
    let k = key("s", None);
    let other = key("other", None);
    // This node ran generations 1 and 2 of the session, then it moved to another node.
    let first = use_once(&reg, &k);
    assert!(reg.forget(&first.slot, Some(LossReason::IdleReaped)));
    let second = use_once(&reg, &k);
    assert_eq!(second.slot.generation(), 2);
    assert!(reg.forget(&second.slot, None));
    use_once(&reg, &other);
    assert!(!reg.has_session("t", "s") && reg.has_session("t", "other"));
    let lost = StateLost {
        reason: LossReason::NodeLost,
        at: "2026-01-01T00:00:00Z".into(),
        workspace_lost: false,
    };
    // The cluster says generation 7 ran elsewhere and was lost with its node.
    reg.adopt(
        "t",
        "s",
        vec![Entry {
            key_hash: k.hash(),
            tenant: "t".into(),
            owner: "s".into(),
            generation: 7,
            state: EntryState::Lost { loss: lost.clone() },
        }],
    );
    let back = use_once(&reg, &k);
    assert_eq!(
        back.slot.generation(),
        8,
        "generations continue from the cluster's"
    );
    assert_eq!(back.state_lost, Some(lost), "the loss is reported once");
    assert!(reg.has_session("t", "s"));
    // A key the entries do not name keeps what this node knows.
    assert_eq!(use_once(&reg, &other).slot.generation(), 1);
}

#[test]
fn sessions_settings_past_the_tenants_byte_budget_forget_the_oldest_idle_ones_first() {
    use crate::settings::{Settings, MAX_SETTINGS_BYTES_PER_TENANT};
    let reg = Registry::new(8, Duration::from_secs(60));
    let big = |tag: &str| Settings {
        env: [("V".to_string(), tag.repeat(32 * 1024 - 1))].into(),
        ..Settings::default()
    };
    let per = big("x").bytes();
    let fit = MAX_SETTINGS_BYTES_PER_TENANT / per;
    for i in 0..=fit {
        reg.set_settings("t", &format!("s{i}"), big("x"))
            .expect("room is made");
    }
    // The oldest went to make room for the last; the newest and another tenant's stay.
    assert!(reg.settings("t", "s0").is_none());
    assert!(reg.settings("t", &format!("s{fit}")).is_some());
    reg.set_settings("u", "s0", big("y"))
        .expect("another tenant");
    assert!(reg.settings("u", "s0").is_some());
    // A session with a live kernel is never forgotten: with every session live, a new one
    // past the budget is refused and the old settings stay.
    let reg = Registry::new(fit + 8, Duration::from_secs(60));
    for i in 0..fit {
        let s = format!("s{i}");
        reg.set_settings("t", &s, big("x")).expect("fits");
        let _held = att(&reg, &tkey("t", &s, None));
    }
    assert_eq!(
        reg.set_settings("t", "late", big("x"))
            .map_err(|e| e.code()),
        Err("too_many_settings")
    );
    assert!(reg.settings("t", "s0").is_some());
}
