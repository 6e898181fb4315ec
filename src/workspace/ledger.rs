//! Where a cluster keeps which node holds each workspace, and its generation
//! (`docs/workspaces.md`, "In a cluster"). On one host the images' directory is the only copy
//! of a workspace and needs no ledger; a cluster node has one (`kb_workspaces` in the
//! catalog, `src/cluster/`), so that an image left on a node's disk by an earlier generation
//! of the workspace is known stale and never served as the workspace, and so that a tenant's
//! count of workspaces is the cluster's.

/// What the ledger answers when a node opens a workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// This node's image is the workspace, of this generation (stamp it if it has another:
    /// an image made before generations were kept is adopted so).
    Current {
        /// The workspace's generation.
        generation: u64,
    },
    /// The workspace is made anew here with this generation; any image this node holds of
    /// it is stale (its files are another generation's) and goes first.
    Fresh {
        /// The new generation.
        generation: u64,
    },
    /// Not made (it was not to be): this node holds no current image of it.
    NotFound,
    /// Making it would pass the tenant's maximum, counted across the cluster.
    TooMany,
}

/// A workspace the ledger places on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// The tenant that holds the workspace.
    pub tenant: String,
    /// Its owner (`session` or `session::child::id`).
    pub owner: String,
    /// The workspace's generation, which a newer placement bumps.
    pub generation: u64,
}

/// The ledger of a cluster's workspaces (see the module documentation). Every answer comes
/// from one transaction of the catalog, within its operation deadline.
#[async_trait::async_trait]
pub trait Ledger: Send + Sync + std::fmt::Debug {
    /// Opens `tenant`'s workspace `owner` on this node, whose image of it has the generation
    /// `local` (`Some(0)`: an image without a stamp; `None`: no image). When `create`, a
    /// workspace this node does not hold current is made anew (its generation one past the
    /// last) unless the tenant holds `max` others on live nodes; the count and the record
    /// are one transaction.
    async fn open(
        &self,
        tenant: &str,
        owner: &str,
        local: Option<u64>,
        create: bool,
        max: usize,
    ) -> Result<Opening, super::WorkspaceError>;

    /// Forgets `tenant`'s workspace `owner` if this node holds it at `generation` (deleted
    /// here); `None`: whatever its generation, if this node holds it.
    async fn forget(
        &self,
        tenant: &str,
        owner: &str,
        generation: Option<u64>,
    ) -> Result<(), super::WorkspaceError>;

    /// The workspaces the ledger places on this node (of `tenant` only, when given).
    async fn here(&self, tenant: Option<&str>) -> Result<Vec<Placed>, super::WorkspaceError>;
}
