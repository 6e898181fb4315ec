use super::redb_store::{BY_TENANT, REDB_MAGIC, TENANT_ROWS};
use std::sync::Arc;

use super::*;
use crate::cell::LossReason;

fn loss(reason: LossReason) -> StateLost {
    StateLost {
        reason,
        at: "2026-01-01T00:00:00Z".into(),
        workspace_lost: false,
    }
}

fn started(hash: &str, generation: u64) -> Change {
    Change::Started {
        key_hash: hash.into(),
        tenant: "t".into(),
        owner: format!("owner-{hash}"),
        generation,
    }
}

fn lost(hash: &str, generation: u64, reason: LossReason) -> Change {
    Change::Lost {
        key_hash: hash.into(),
        tenant: "t".into(),
        owner: format!("owner-{hash}"),
        generation,
        loss: loss(reason),
    }
}

fn state_of(catalog: &dyn Catalog, hash: &str) -> Option<(u64, EntryState)> {
    catalog
        .load()
        .expect("load")
        .into_iter()
        .find(|e| e.key_hash == hash)
        .map(|e| (e.generation, e.state))
}

/// The shared rules, through any implementation.
fn rules_hold(catalog: &dyn Catalog) {
    catalog
        .apply(&[started("a", 1), started("b", 1), started("c", 3)])
        .expect("apply");
    catalog
        .apply(&[
            lost("a", 1, LossReason::Evicted),
            Change::Ended {
                key_hash: "b".into(),
            },
            // An end never hides a loss still owed.
            Change::Ended {
                key_hash: "a".into(),
            },
            // Unknown keys end quietly.
            Change::Ended {
                key_hash: "zzz".into(),
            },
        ])
        .expect("apply");
    catalog
        .apply(&[Change::AllLiveLost {
            loss: loss(LossReason::ServerRestarted),
        }])
        .expect("apply");
    assert_eq!(
        state_of(catalog, "a"),
        Some((
            1,
            EntryState::Lost {
                loss: loss(LossReason::Evicted)
            }
        ))
    );
    assert_eq!(state_of(catalog, "b"), Some((1, EntryState::Ended)));
    assert_eq!(
        state_of(catalog, "c"),
        Some((
            3,
            EntryState::Lost {
                loss: loss(LossReason::ServerRestarted)
            }
        ))
    );
    assert_eq!(state_of(catalog, "zzz"), None);
    // Generations only grow; a start clears the loss.
    catalog.apply(&[started("c", 2)]).expect("apply");
    assert_eq!(state_of(catalog, "c"), Some((3, EntryState::Live)));
    // Least recently changed first.
    let order: Vec<String> = catalog
        .load()
        .expect("load")
        .into_iter()
        .map(|e| e.key_hash)
        .collect();
    assert_eq!(order, vec!["a", "b", "c"]);
}

#[test]
fn memory_catalog_follows_the_rules() {
    rules_hold(&MemoryCatalog::default());
}

#[test]
fn redb_catalog_follows_the_rules_and_survives_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    {
        let catalog = RedbCatalog::open(&state).expect("open creates the directory");
        rules_hold(&catalog);
    }
    let catalog = RedbCatalog::open(&state).expect("reopen");
    assert_eq!(state_of(&catalog, "c"), Some((3, EntryState::Live)));
    assert_eq!(catalog.load().expect("load").len(), 3);
}

#[test]
fn a_second_open_of_the_same_directory_is_refused_while_the_first_holds_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = RedbCatalog::open(dir.path()).expect("open");
    let err = RedbCatalog::open(dir.path()).expect_err("locked");
    assert!(matches!(err, CatalogError::Locked { .. }), "{err}");
    assert!(err.to_string().contains("catalog.redb"), "{err}");
    drop(first);
    RedbCatalog::open(dir.path()).expect("free again");
}

#[test]
fn a_corrupt_file_is_a_clear_error_and_a_missing_one_starts_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let catalog = RedbCatalog::open(dir.path()).expect("a missing file is created");
    assert!(catalog.load().expect("load").is_empty());
    drop(catalog);
    std::fs::write(dir.path().join(FILE_NAME), b"this is not a database at all").expect("w");
    let err = RedbCatalog::open(dir.path()).expect_err("corrupt");
    assert!(matches!(err, CatalogError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("catalog.redb"), "{err}");
    // A damaged body behind a valid magic number is an error too, never a panic.
    let mut bytes = REDB_MAGIC.to_vec();
    bytes.extend(std::iter::repeat_n(0xAB, 8192));
    std::fs::write(dir.path().join(FILE_NAME), bytes).expect("w");
    let err = RedbCatalog::open(dir.path()).expect_err("corrupt");
    assert!(
        matches!(
            err,
            CatalogError::Corrupt { .. } | CatalogError::Storage { .. }
        ),
        "{err}"
    );
    // A state directory that cannot be created names it.
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"x").expect("w");
    let err = RedbCatalog::open(&file.join("sub")).expect_err("not a directory");
    assert!(matches!(err, CatalogError::Dir { .. }), "{err}");
}

fn started_of(tenant: &str, hash: &str) -> Change {
    Change::Started {
        key_hash: hash.into(),
        tenant: tenant.into(),
        owner: format!("owner-{hash}"),
        generation: 1,
    }
}

fn lost_of(tenant: &str, hash: &str) -> Change {
    Change::Lost {
        key_hash: hash.into(),
        tenant: tenant.into(),
        owner: format!("owner-{hash}"),
        generation: 1,
        loss: loss(LossReason::IdleReaped),
    }
}

fn rows_of(catalog: &dyn Catalog, tenant: &str) -> Vec<Entry> {
    catalog
        .load()
        .expect("load")
        .into_iter()
        .filter(|e| e.tenant == tenant)
        .collect()
}

#[test]
fn a_tenant_is_bounded_and_keeps_its_live_rows() {
    let catalog = MemoryCatalog::default();
    // The oldest row is live: it stays however many rows follow.
    catalog.apply(&[started("live", 1)]).expect("apply");
    let ended: Vec<Change> = (0..MAX_ENTRIES_PER_TENANT + 10)
        .flat_map(|i| {
            let hash = format!("k{i}");
            [
                started(&hash, 1),
                Change::Ended {
                    key_hash: hash.clone(),
                },
            ]
        })
        .collect();
    catalog.apply(&ended).expect("apply");
    let entries = catalog.load().expect("load");
    assert_eq!(entries.len(), MAX_ENTRIES_PER_TENANT);
    assert!(entries.iter().any(|e| e.key_hash == "live"));
    assert!(
        !entries.iter().any(|e| e.key_hash == "k0"),
        "oldest go first"
    );
    assert!(entries
        .iter()
        .any(|e| e.key_hash == format!("k{}", MAX_ENTRIES_PER_TENANT + 9)));
}

/// Tenant b owes a loss; tenant a then churns through `churn` keys (past its own bound). b's
/// loss stays, and a keeps its own newest rows, at most its bound.
fn one_tenants_churn_keeps_another_tenants_owed_loss(catalog: &dyn Catalog, churn: usize) {
    catalog
        .apply(&[
            started_of("b", "b-victim"),
            Change::Lost {
                key_hash: "b-victim".into(),
                tenant: "b".into(),
                owner: "victim".into(),
                generation: 1,
                loss: loss(LossReason::Evicted),
            },
        ])
        .expect("apply");
    let changes: Vec<Change> = (0..churn).map(|i| lost_of("a", &format!("a{i}"))).collect();
    for batch in changes.chunks(8_192) {
        catalog.apply(batch).expect("apply");
    }
    assert_eq!(
        state_of(catalog, "b-victim"),
        Some((
            1,
            EntryState::Lost {
                loss: loss(LossReason::Evicted)
            }
        )),
        "b's owed loss survived a's churn"
    );
    let a = rows_of(catalog, "a");
    assert_eq!(a.len(), MAX_ENTRIES_PER_TENANT);
    assert_eq!(
        a[0].key_hash,
        format!("a{}", churn - MAX_ENTRIES_PER_TENANT)
    );
}

#[test]
fn one_tenants_churn_never_pushes_out_another_tenants_owed_loss() {
    // More keys than the catalog keeps in all.
    one_tenants_churn_keeps_another_tenants_owed_loss(&MemoryCatalog::default(), MAX_ENTRIES + 10);
}

#[test]
fn past_the_bound_in_all_the_tenant_holding_the_most_rows_gives_way() {
    let catalog = MemoryCatalog::default();
    // The oldest rows: one owed loss of a small tenant.
    catalog.apply(&[lost_of("small", "s0")]).expect("apply");
    // Then five tenants, four at their own bound and one just below: more than the bound in
    // all. Only they give rows up, the largest first, until they are level.
    let mut changes = Vec::new();
    for t in 0..5 {
        let n = if t == 4 {
            MAX_ENTRIES_PER_TENANT - 100
        } else {
            MAX_ENTRIES_PER_TENANT
        };
        changes.extend((0..n).map(|i| lost_of(&format!("big{t}"), &format!("big{t}-{i}"))));
    }
    catalog.apply(&changes).expect("apply");
    let entries = catalog.load().expect("load");
    assert_eq!(entries.len(), MAX_ENTRIES);
    assert!(
        entries.iter().any(|e| e.key_hash == "s0"),
        "the small tenant kept its row"
    );
    let held: Vec<usize> = (0..5)
        .map(|t| rows_of(&catalog, &format!("big{t}")).len())
        .collect();
    let (most, least) = (
        held.iter().max().copied().unwrap_or(0),
        held.iter().min().copied().unwrap_or(0),
    );
    assert!(most - least <= 1, "{held:?}");
    // Each gave up its own oldest rows.
    for t in 0..5 {
        let own = rows_of(&catalog, &format!("big{t}"));
        let first: usize = own[0]
            .key_hash
            .rsplit('-')
            .next()
            .and_then(|n| n.parse().ok())
            .expect("n");
        assert!(first > 0, "big{t} lost its oldest first");
    }
}

#[test]
fn the_redb_catalog_is_bounded_per_tenant_too_and_indexes_an_older_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let catalog = RedbCatalog::open(dir.path()).expect("open");
        one_tenants_churn_keeps_another_tenants_owed_loss(&catalog, MAX_ENTRIES_PER_TENANT + 10);
    }
    let catalog = RedbCatalog::open(dir.path()).expect("reopen");
    let entries = catalog.load().expect("load");
    assert_eq!(entries.len(), MAX_ENTRIES_PER_TENANT + 1);
    drop(catalog);

    // A file written before the per-tenant tables existed: they are built at open.
    {
        let db = redb::Database::create(dir.path().join(FILE_NAME)).expect("open the file");
        let txn = db.begin_write().expect("write");
        assert!(txn.delete_table(BY_TENANT).expect("delete"));
        assert!(txn.delete_table(TENANT_ROWS).expect("delete"));
        txn.commit().expect("commit");
    }
    let catalog = RedbCatalog::open(dir.path()).expect("reopen an older file");
    // b's loss is still owed and a still at its bound after 100 more of a's rows.
    let more: Vec<Change> = (0..100)
        .map(|i| lost_of("a", &format!("more{i}")))
        .collect();
    catalog.apply(&more).expect("apply");
    assert_eq!(rows_of(&catalog, "a").len(), MAX_ENTRIES_PER_TENANT);
    assert!(matches!(
        state_of(&catalog, "b-victim"),
        Some((1, EntryState::Lost { .. }))
    ));
}

#[test]
fn the_writer_applies_in_order_and_counts_failures() {
    #[derive(Debug)]
    struct Broken;
    impl Catalog for Broken {
        fn load(&self) -> Result<Vec<Entry>, CatalogError> {
            Ok(Vec::new())
        }
        fn apply(&self, _: &[Change]) -> Result<(), CatalogError> {
            Err(CatalogError::Storage {
                path: "broken".into(),
                operation: "writing",
                reason: "disk full".into(),
            })
        }
        fn add_usage(&self, _: &[UsageRow], _: u64) -> Result<(), CatalogError> {
            Ok(())
        }
        fn usage(&self, _: Option<&str>, _: u64, _: u64) -> Result<Vec<UsageRow>, CatalogError> {
            Ok(Vec::new())
        }
    }
    let catalog = Arc::new(MemoryCatalog::default());
    let writer = CatalogWriter::start(catalog.clone()).expect("thread");
    writer.record(started("a", 1));
    writer.record(lost("a", 1, LossReason::Oom));
    writer.flush();
    assert!(matches!(
        state_of(catalog.as_ref(), "a"),
        Some((1, EntryState::Lost { .. }))
    ));
    let durable = writer.record_durable(started("a", 2));
    futures::executor::block_on(durable).expect("durable");
    assert_eq!(state_of(catalog.as_ref(), "a"), Some((2, EntryState::Live)));
    writer.record(started("a", 2));
    writer.close();
    assert_eq!(state_of(catalog.as_ref(), "a"), Some((2, EntryState::Live)));
    writer.record(started("b", 1));
    assert_eq!(state_of(catalog.as_ref(), "b"), None, "ignored after close");
    assert_eq!(writer.failures(), 0);

    let broken = CatalogWriter::start(Arc::new(Broken)).expect("thread");
    broken.record(started("a", 1));
    let durable = broken.record_durable(started("b", 1));
    broken.flush();
    assert_eq!(broken.failures(), 2);
    assert!(
        futures::executor::block_on(durable).is_err(),
        "a failed write is never confirmed"
    );
    broken.close();
}

#[test]
fn the_usage_ledger_sums_rows_reads_ranges_and_prunes_by_age() {
    let dir = tempfile::tempdir().expect("dir");
    let redb = RedbCatalog::open(dir.path()).expect("open");
    let memory = MemoryCatalog::default();
    let row = |tenant: &str, session: &str, start: u64, cells: u64| UsageRow {
        tenant: tenant.into(),
        session: session.into(),
        start,
        cells,
        peak_memory_bytes: cells * 10,
        ..UsageRow::default()
    };
    for catalog in [&redb as &dyn Catalog, &memory] {
        catalog
            .add_usage(&[row("a", "s", 3_600, 1), row("b", "s", 3_600, 5)], 0)
            .expect("add");
        catalog
            .add_usage(&[row("a", "s", 3_600, 2)], 0)
            .expect("add");
        catalog
            .add_usage(&[row("a", "s", 7_200, 4)], 0)
            .expect("add");
        let a = catalog.usage(Some("a"), 0, 7_200).expect("read");
        assert_eq!(a.len(), 1);
        assert_eq!((a[0].cells, a[0].peak_memory_bytes), (3, 20));
        assert_eq!(catalog.usage(None, 0, 10_800).expect("read").len(), 3);
        catalog.add_usage(&[], 7_200).expect("prune");
        let left = catalog.usage(None, 0, 10_800).expect("read");
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].start, 7_200);
    }
    drop(redb);
    let reopened = RedbCatalog::open(dir.path()).expect("reopen");
    assert_eq!(
        reopened.usage(Some("a"), 0, 10_800).expect("read")[0].cells,
        4
    );
}
