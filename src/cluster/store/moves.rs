//! A session moved from one node to another (docs/cluster.md, "Migration on drain"): the
//! session's row and its kernels' live rows pass from the node it leaves to the node that
//! received its kernel, in one transaction under the tenant's claim lock, and only while
//! both nodes are live at the epochs the move names. A node fenced meanwhile (its epoch
//! moved on) or a session that moved, ended or was claimed elsewhere since leaves the
//! catalog untouched: the move is refused and the kernel is lost and told as without it.

use crate::catalog::Entry;

use super::super::error::{db, ClusterError};
use super::sessions::{session_entries, CLAIM_LOCK_TIMEOUT, TENANT_LOCK_CLASS};
use super::{within, Store};

/// One move: the session, the node it leaves and the node it reaches, each at its epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionMove {
    /// The session's tenant.
    pub tenant: String,
    /// The root session.
    pub session: String,
    /// The node the session leaves, and its epoch.
    pub from: (String, i64),
    /// The node that takes it, and its epoch.
    pub to: (String, i64),
}

impl Store {
    /// Moves the session (see the module documentation). `Some(entries)`: moved, with the
    /// session's kernels' rows for the new node to adopt; `None`: refused, nothing changed.
    pub async fn move_session(&self, m: &SessionMove) -> Result<Option<Vec<Entry>>, ClusterError> {
        let op = "move session";
        within(op, async {
            let mut client = self.client(op).await?;
            let tx = client.transaction().await.map_err(db(op))?;
            tx.batch_execute(CLAIM_LOCK_TIMEOUT).await.map_err(db(op))?;
            tx.execute(
                "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                &[&TENANT_LOCK_CLASS, &m.tenant],
            )
            .await
            .map_err(db(op))?;
            let nodes = tx
                .query(
                    "SELECT name FROM kb_nodes
                     WHERE ((name = $1 AND epoch = $2) OR (name = $3 AND epoch = $4))
                       AND state = 'live'
                     FOR SHARE",
                    &[&m.from.0, &m.from.1, &m.to.0, &m.to.1],
                )
                .await
                .map_err(db(op))?;
            if nodes.len() != 2 {
                return Ok(None);
            }
            let moved = tx
                .execute(
                    "UPDATE kb_sessions SET node = $5, epoch = $6, claimed_at = now()
                     WHERE tenant = $1 AND session = $2 AND node = $3 AND epoch = $4 AND live",
                    &[
                        &m.tenant, &m.session, &m.from.0, &m.from.1, &m.to.0, &m.to.1,
                    ],
                )
                .await
                .map_err(db(op))?;
            if moved != 1 {
                return Ok(None);
            }
            tx.execute(
                "UPDATE kb_kernels SET node = $5, epoch = $6, changed_at = clock_timestamp()
                 WHERE tenant = $1 AND session = $2 AND node = $3 AND epoch = $4
                   AND state = 'live'",
                &[
                    &m.tenant, &m.session, &m.from.0, &m.from.1, &m.to.0, &m.to.1,
                ],
            )
            .await
            .map_err(db(op))?;
            let entries = session_entries(&tx, &m.tenant, &m.session).await?;
            tx.commit().await.map_err(db(op))?;
            Ok(Some(entries))
        })
        .await
    }
}
