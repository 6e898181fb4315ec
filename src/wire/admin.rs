//! The operator's answers (`docs/console.md`, "Routes"): who a token is, every tenant's
//! kernels a page at a time, the tenants with their live kernels against their caps. The
//! console shows these; any client holding the token may call them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::KernelSummary;

/// Most kernels one page of `GET /v1/admin/kernels` holds.
pub const MAX_KERNEL_PAGE: usize = 500;
/// A page's size when the query names none.
pub const DEFAULT_KERNEL_PAGE: usize = 50;
/// Longest `q` (search text) taken, in bytes.
pub const MAX_KERNEL_SEARCH: usize = 200;

/// Whom a token stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The admin token (`serve --admin-token`): every tenant, and the admin routes.
    Admin,
    /// A tenant's token: that tenant only.
    Tenant,
}

/// `GET /v1/whoami`: whom the caller's token stands for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Identity {
    /// `admin` or `tenant`.
    pub role: Role,
    /// The tenant, for a tenant's token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// This server is a cluster node (`GET /v1/nodes` answers the admin token).
    pub cluster: bool,
}

/// The query of `GET /v1/admin/kernels`: which kernels, which page. Kernels are ordered by
/// tenant, then owner, then generation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KernelPageQuery {
    /// Kernels skipped before the page (default 0).
    #[serde(default)]
    pub offset: usize,
    /// Kernels in the page (default [`DEFAULT_KERNEL_PAGE`], at most [`MAX_KERNEL_PAGE`]).
    #[serde(default)]
    pub limit: Option<usize>,
    /// Only this tenant's kernels.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Only kernels in this state (`starting`, `idle`, `busy`).
    #[serde(default)]
    pub state: Option<String>,
    /// Only kernels whose id, owner or a label's key or value contains this text.
    #[serde(default)]
    pub q: Option<String>,
}

impl KernelPageQuery {
    /// The page's size; an error names what is out of bounds.
    pub fn page_size(&self) -> Result<usize, String> {
        match self.limit {
            None => Ok(DEFAULT_KERNEL_PAGE),
            Some(0) => Err("limit must be at least 1".into()),
            Some(n) if n > MAX_KERNEL_PAGE => {
                Err(format!("limit {n} is more than {MAX_KERNEL_PAGE}"))
            }
            Some(n) => Ok(n),
        }
    }

    /// An error when the search text is too long.
    pub fn check(&self) -> Result<usize, String> {
        if self.q.as_ref().is_some_and(|q| q.len() > MAX_KERNEL_SEARCH) {
            return Err(format!("q is longer than {MAX_KERNEL_SEARCH} bytes"));
        }
        self.page_size()
    }

    /// True when `kernel` passes the query's filters.
    pub fn matches(&self, kernel: &KernelSummary) -> bool {
        if self.tenant.as_ref().is_some_and(|t| *t != kernel.tenant) {
            return false;
        }
        if self.state.as_ref().is_some_and(|s| *s != kernel.state) {
            return false;
        }
        match self.q.as_deref().filter(|q| !q.is_empty()) {
            None => true,
            Some(q) => {
                kernel.id.contains(q)
                    || kernel.owner.contains(q)
                    || kernel
                        .labels
                        .iter()
                        .any(|(k, v)| k.contains(q) || v.contains(q))
            }
        }
    }
}

/// `GET /v1/admin/kernels`: one page of every tenant's live kernels on this server.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct KernelPage {
    /// The page's kernels.
    pub kernels: Vec<KernelSummary>,
    /// Kernels matching the query, on every page.
    pub total: usize,
    /// Kernels skipped before this page.
    pub offset: usize,
    /// The page size asked for.
    pub limit: usize,
}

/// One tenant as the operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TenantEntry {
    /// The tenant's name.
    pub name: String,
    /// Its kernels live on this server now.
    pub live_kernels: usize,
    /// Its cap of live kernels (none: only the server's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_kernels: Option<usize>,
    /// Kernels kept for it (its fair share, `reserved` in the tenants file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved: Option<usize>,
    /// Cells it ran since the server started.
    pub cells: u64,
}

/// `GET /v1/admin/tenants`: every tenant, by name, and the server's cap.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct TenantOverview {
    /// The tenants.
    pub tenants: Vec<TenantEntry>,
    /// The server's cap of live kernels, every tenant's together.
    pub max_kernels: usize,
}
