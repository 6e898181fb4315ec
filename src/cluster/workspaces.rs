//! [`WorkspaceLedger`]: the workspaces' [`Ledger`] of a cluster node over `kb_workspaces`
//! (docs/workspaces.md, "In a cluster").

use super::store::Store;
use crate::workspace::{Ledger, Opening, Placed, WorkspaceError};

/// The ledger of the node `node` (see [`Ledger`]).
#[derive(Debug, Clone)]
pub struct WorkspaceLedger {
    store: Store,
    node: String,
}

impl WorkspaceLedger {
    /// The ledger of `node` in `store`.
    pub fn new(store: Store, node: String) -> WorkspaceLedger {
        WorkspaceLedger { store, node }
    }
}

fn refused(op: &'static str) -> impl Fn(super::ClusterError) -> WorkspaceError {
    move |e| WorkspaceError::Ledger {
        op,
        reason: e.to_string(),
    }
}

#[async_trait::async_trait]
impl Ledger for WorkspaceLedger {
    async fn open(
        &self,
        tenant: &str,
        owner: &str,
        local: Option<u64>,
        create: bool,
        max: usize,
    ) -> Result<Opening, WorkspaceError> {
        self.store
            .open_workspace(tenant, owner, &self.node, local, create, max)
            .await
            .map_err(refused("open the workspace"))
    }

    async fn forget(
        &self,
        tenant: &str,
        owner: &str,
        generation: Option<u64>,
    ) -> Result<(), WorkspaceError> {
        self.store
            .forget_workspace(tenant, owner, &self.node, generation)
            .await
            .map(|_| ())
            .map_err(refused("forget the workspace"))
    }

    async fn here(&self, tenant: Option<&str>) -> Result<Vec<Placed>, WorkspaceError> {
        self.store
            .workspaces_on(&self.node, tenant)
            .await
            .map_err(refused("list this node's workspaces"))
    }
}
