//! The configuration file (`kernelbox serve --config FILE`, `docs/configuration.md`): one TOML
//! document, typed here with serde (`deny_unknown_fields` everywhere) and `schemars`, so the
//! shipped JSON Schema (`docs/config.schema.json`) and the reference in
//! `docs/configuration.md` are generated from the same types the server reads.
//!
//! The file holds values as an operator writes them (`"30m"`, `"512m"`, a secret's source);
//! the binary turns them into the same resolved values its flags produce (`src/cli/config.rs`),
//! and the tenants go through the tenants file's own checks
//! (`crate::server::tenants::Tenants::from_entries`).
//!
//! | file | what |
//! |---|---|
//! | `document.rs` | [`ConfigFile`] and its sections |
//! | `tenant.rs` | [`TenantEntry`]: one `[[tenants]]` table, also the type of `[tenant_defaults]` |
//! | `values.rs` | [`Size`], [`HumanDuration`], [`Secret`]: values kept as written, checked when read |
//! | `load.rs` | [`ConfigFile::parse`], [`ConfigFileError`] (the key path, line and column), the schema |
//! | `restart.rs` | [`needs_restart`]: the keys a reload cannot apply that changed |
//! | `tests.rs` | unit tests |

mod document;
mod load;
mod restart;
mod tenant;
#[cfg(test)]
mod tests;
mod values;

pub use document::*;
pub use load::*;
pub use restart::needs_restart;
pub use tenant::*;
pub use values::*;
