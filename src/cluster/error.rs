//! Why an operation on the cluster's store failed ([`ClusterError`]), and the one mapping of
//! a database error to it.

use std::time::Duration;

/// Why an operation on the cluster's store failed. Each variant names the operation; none
/// prints the database URL's password.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The database URL could not be read.
    #[error("cluster store: the database URL is not a PostgreSQL URL ({reason})")]
    Url {
        /// Why (the parser's words; the URL itself is never repeated).
        reason: String,
    },
    /// No connection could be had (the database is down, refuses us, or the pool is busy).
    #[error("cluster store: {operation}: no connection to {target}: {reason}")]
    Connection {
        /// What was being done.
        operation: &'static str,
        /// `user@host:port/database`, without the password.
        target: String,
        /// What the database client said.
        reason: String,
    },
    /// A statement failed.
    #[error("cluster store: {operation}: {source}")]
    Db {
        /// What was being done.
        operation: &'static str,
        /// The database's error.
        source: tokio_postgres::Error,
    },
    /// The operation did not finish within [`OPERATION_DEADLINE`](super::OPERATION_DEADLINE).
    #[error("cluster store: {operation}: no answer within {deadline:?}")]
    Timeout {
        /// What was being done.
        operation: &'static str,
        /// The deadline that passed.
        deadline: Duration,
    },
    /// The database was migrated by a newer kernelbox.
    #[error(
        "cluster store: migrate: the database's schema is version {found}, newer than this \
         kernelbox knows ({known}); upgrade this node"
    )]
    SchemaTooNew {
        /// The database's version.
        found: i32,
        /// The newest version this build knows.
        known: i32,
    },
    /// A row held a value this build cannot read (a newer kernelbox wrote it).
    #[error("cluster store: {operation}: unreadable row: {reason}")]
    Row {
        /// What was being done.
        operation: &'static str,
        /// What was wrong.
        reason: String,
    },
}

/// Maps a database error to [`ClusterError::Db`] naming `operation`.
pub(crate) fn db(operation: &'static str) -> impl Fn(tokio_postgres::Error) -> ClusterError {
    move |source| ClusterError::Db { operation, source }
}
