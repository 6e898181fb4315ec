//! Sessions' own network policies and settings in the catalog (docs/cluster.md, "Session
//! policies and settings"): `kb_session_config`, one row per session that set either.
//!
//! A write and the read a claim makes both hold the tenant's lock (the one claims of the
//! tenant take, `sessions.rs`), so they are ordered: a write refuses a session live on another
//! node (that node applies it: the request is retried there), and each write and each read
//! takes a new number of one sequence as its version. A node keeps what it loaded or wrote
//! with that version and never lets an older one replace a newer (`src/egress/sessions.rs`,
//! `src/registry/settings.rs`). A tenant's rows are bounded in bytes, each field by its own
//! bound, counted over that tenant's rows only (the primary key's prefix).

use super::super::error::{db, ClusterError};
use super::sessions::{
    placement_from_row, Placement, CLAIM_LOCK_TIMEOUT, PLACEMENT, TENANT_LOCK_CLASS,
};
use super::{within, Store};

/// One field of a session's row, as JSON text (`None`: the session has none) with the bytes
/// its tenant's bound counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigField<'a> {
    /// The session's own network policy.
    Network(Option<&'a str>, usize),
    /// The session's settings.
    Settings(Option<&'a str>, usize),
}

/// What a write found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigWrite {
    /// Written at this version.
    Written {
        /// The write's version.
        version: u64,
    },
    /// The session is live on another node whose lease is current: written there, not here.
    Held(Placement),
    /// The tenant's rows would hold more than the field's bound.
    TooMany,
}

/// A session's row as a claim loads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionConfig {
    /// The network policy's JSON text.
    pub network: Option<String>,
    /// The settings' JSON text.
    pub settings: Option<String>,
    /// The read's version: every later write has a greater one.
    pub version: u64,
}

fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Store {
    /// Sets one field of `tenant`'s `session`'s row (see the module documentation), served by
    /// `node`: refused when the session is live on another current node, or when the tenant's
    /// rows would hold more than `max_bytes` of that field.
    pub async fn put_session_config(
        &self,
        tenant: &str,
        session: &str,
        node: &str,
        field: ConfigField<'_>,
        max_bytes: usize,
    ) -> Result<ConfigWrite, ClusterError> {
        let op = "write session policy or settings";
        within(op, async {
            let mut client = self.client(op).await?;
            let tx = client.transaction().await.map_err(db(op))?;
            tx.batch_execute(CLAIM_LOCK_TIMEOUT).await.map_err(db(op))?;
            tx.execute(
                "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                &[&TENANT_LOCK_CLASS, &tenant],
            )
            .await
            .map_err(db(op))?;
            let placed = tx
                .query_opt(PLACEMENT, &[&tenant, &session])
                .await
                .map_err(db(op))?;
            let placed = placed.as_ref().map(placement_from_row).transpose()?;
            if let Some(p) = placed.filter(|p| p.live && p.node_current && p.node != node) {
                return Ok(ConfigWrite::Held(p));
            }
            let (column, text, bytes) = match field {
                ConfigField::Network(text, bytes) => ("network", text, bytes),
                ConfigField::Settings(text, bytes) => ("settings", text, bytes),
            };
            let bytes = if text.is_some() { to_i64(bytes) } else { 0 };
            let others: i64 = tx
                .query_one(
                    &format!(
                        "SELECT coalesce(sum({column}_bytes), 0)::bigint FROM kb_session_config
                         WHERE tenant = $1 AND session <> $2"
                    ),
                    &[&tenant, &session],
                )
                .await
                .map_err(db(op))?
                .try_get(0)
                .map_err(db(op))?;
            if text.is_some() && others.saturating_add(bytes) > to_i64(max_bytes) {
                return Ok(ConfigWrite::TooMany);
            }
            let version: i64 = tx
                .query_one("SELECT nextval('kb_session_config_seq')", &[])
                .await
                .map_err(db(op))?
                .try_get(0)
                .map_err(db(op))?;
            tx.execute(
                &format!(
                    "INSERT INTO kb_session_config (tenant, session, {column}, {column}_bytes,
                         version)
                     VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (tenant, session) DO UPDATE SET {column} = EXCLUDED.{column},
                         {column}_bytes = EXCLUDED.{column}_bytes, version = EXCLUDED.version"
                ),
                &[&tenant, &session, &text, &bytes, &version],
            )
            .await
            .map_err(db(op))?;
            tx.execute(
                "DELETE FROM kb_session_config WHERE tenant = $1 AND session = $2
                     AND network IS NULL AND settings IS NULL",
                &[&tenant, &session],
            )
            .await
            .map_err(db(op))?;
            tx.commit().await.map_err(db(op))?;
            Ok(ConfigWrite::Written {
                version: u64::try_from(version).unwrap_or(0),
            })
        })
        .await
    }

    /// `tenant`'s `session`'s row, read under the tenant's lock with a new version (what a node
    /// that claimed the session loads before its kernel starts).
    pub async fn load_session_config(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<SessionConfig, ClusterError> {
        let op = "read session policy and settings";
        within(op, async {
            let mut client = self.client(op).await?;
            let tx = client.transaction().await.map_err(db(op))?;
            tx.batch_execute(CLAIM_LOCK_TIMEOUT).await.map_err(db(op))?;
            tx.execute(
                "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                &[&TENANT_LOCK_CLASS, &tenant],
            )
            .await
            .map_err(db(op))?;
            let row = tx
                .query_opt(
                    "SELECT network, settings FROM kb_session_config
                     WHERE tenant = $1 AND session = $2",
                    &[&tenant, &session],
                )
                .await
                .map_err(db(op))?;
            let version: i64 = tx
                .query_one("SELECT nextval('kb_session_config_seq')", &[])
                .await
                .map_err(db(op))?
                .try_get(0)
                .map_err(db(op))?;
            tx.commit().await.map_err(db(op))?;
            let mut config = SessionConfig {
                version: u64::try_from(version).unwrap_or(0),
                ..SessionConfig::default()
            };
            if let Some(row) = row {
                config.network = row.try_get(0).map_err(db(op))?;
                config.settings = row.try_get(1).map_err(db(op))?;
            }
            Ok(config)
        })
        .await
    }

    /// Forgets the rows of all of `tenant`'s sessions (the tenant was removed by a reload).
    pub async fn forget_tenant_configs(&self, tenant: &str) -> Result<(), ClusterError> {
        let op = "forget a removed tenant's session policies and settings";
        within(op, async {
            let client = self.client(op).await?;
            client
                .execute(
                    "DELETE FROM kb_session_config WHERE tenant = $1",
                    &[&tenant],
                )
                .await
                .map_err(db(op))?;
            Ok(())
        })
        .await
    }

    /// Forgets `tenant`'s `session`'s row (the session was deleted).
    pub async fn forget_session_config(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<(), ClusterError> {
        let op = "forget session policy and settings";
        within(op, async {
            let client = self.client(op).await?;
            client
                .execute(
                    "DELETE FROM kb_session_config WHERE tenant = $1 AND session = $2",
                    &[&tenant, &session],
                )
                .await
                .map_err(db(op))?;
            Ok(())
        })
        .await
    }
}
