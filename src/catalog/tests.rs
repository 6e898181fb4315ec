use super::redb_store::REDB_MAGIC;
use std::sync::Arc;

use super::*;
use crate::cell::LossReason;

fn loss(reason: LossReason) -> StateLost {
    StateLost {
        reason,
        at: "2026-01-01T00:00:00Z".into(),
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

#[test]
fn the_catalog_is_bounded_and_keeps_live_rows() {
    let catalog = MemoryCatalog::default();
    // The oldest row is live: it stays however many rows follow.
    catalog.apply(&[started("live", 1)]).expect("apply");
    let ended: Vec<Change> = (0..MAX_ENTRIES + 10)
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
    assert_eq!(entries.len(), MAX_ENTRIES);
    assert!(entries.iter().any(|e| e.key_hash == "live"));
    assert!(
        !entries.iter().any(|e| e.key_hash == "k0"),
        "oldest go first"
    );
    assert!(entries
        .iter()
        .any(|e| e.key_hash == format!("k{}", MAX_ENTRIES + 9)));
}

#[test]
fn the_redb_catalog_is_bounded_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let catalog = RedbCatalog::open(dir.path()).expect("open");
    let changes: Vec<Change> = (0..MAX_ENTRIES + 3)
        .map(|i| lost(&format!("k{i}"), 1, LossReason::IdleReaped))
        .collect();
    catalog.apply(&changes).expect("apply");
    drop(catalog);
    let catalog = RedbCatalog::open(dir.path()).expect("reopen");
    let entries = catalog.load().expect("load");
    assert_eq!(entries.len(), MAX_ENTRIES);
    assert_eq!(entries[0].key_hash, "k3");
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
