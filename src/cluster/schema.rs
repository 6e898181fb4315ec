//! The catalog's tables (docs/cluster.md, "Catalog schema"), as versioned migrations.
//!
//! `kernelbox_schema` holds one row per migration applied. Each migration runs in its own
//! transaction under one advisory lock, so several nodes starting at once migrate once: the
//! first applies it, the others wait for the lock and then find its version recorded. A
//! database whose schema is newer than this build knows is refused rather than written.

use super::error::{db, ClusterError};

/// The advisory lock every migration takes (`kbschema` in ASCII, one bigint key).
const MIGRATION_LOCK: i64 = 0x6b62_7363_6865_6d61;

/// The migrations, oldest first: version N is `MIGRATIONS[N - 1]`. Never edit one that has
/// shipped; add the next.
pub(crate) const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6, V7];

/// Version 7: which node holds each workspace, at which generation (docs/workspaces.md, "In
/// a cluster"): an image of another generation on a node's disk is stale, and a tenant's
/// workspaces are counted across the cluster.
const V7: &str = "
CREATE TABLE kb_workspaces (
    tenant     text        NOT NULL,
    owner      text        NOT NULL,
    session    text        NOT NULL,
    node       text        NOT NULL,
    generation bigint      NOT NULL CHECK (generation > 0),
    made_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, owner)
);
CREATE INDEX kb_workspaces_node ON kb_workspaces (node, tenant);
";

/// Version 6: sessions' own network policies and settings, kept in the catalog so that a
/// session's kernel starts under them on whichever node it starts (docs/cluster.md, "Session
/// policies and settings"); `version` orders the writes (one sequence for every row).
const V6: &str = "
CREATE SEQUENCE kb_session_config_seq AS bigint START 1 NO CYCLE;
CREATE TABLE kb_session_config (
    tenant         text   NOT NULL,
    session        text   NOT NULL,
    network        text,
    network_bytes  bigint NOT NULL DEFAULT 0 CHECK (network_bytes >= 0),
    settings       text,
    settings_bytes bigint NOT NULL DEFAULT 0 CHECK (settings_bytes >= 0),
    version        bigint NOT NULL,
    PRIMARY KEY (tenant, session)
);
";

/// Version 5: the usage ledger counts bytes through the egress proxy (docs/usage.md).
const V5: &str = "
ALTER TABLE kb_usage
    ADD COLUMN network_bytes_in  bigint NOT NULL DEFAULT 0,
    ADD COLUMN network_bytes_out bigint NOT NULL DEFAULT 0;
";

/// Version 3: each node's lease TTL in its own row, so that its expiry is judged by the TTL it
/// renews against, whichever node judges (rows of nodes that registered before it get the
/// default TTL, 10 s, until they register again).
const V3: &str = "
ALTER TABLE kb_nodes ADD COLUMN lease_ttl_ms bigint NOT NULL DEFAULT 10000
    CHECK (lease_ttl_ms > 0);
";

/// Version 4: the usage ledger (docs/usage.md, "The usage ledger"): per tenant, session and
/// hour, summed by every node that served the session in that hour.
const V4: &str = "
CREATE TABLE kb_usage (
    hour              bigint           NOT NULL,
    tenant            text             NOT NULL,
    session           text             NOT NULL,
    kernel_seconds    double precision NOT NULL DEFAULT 0,
    cpu_seconds       double precision NOT NULL DEFAULT 0,
    peak_memory_bytes bigint           NOT NULL DEFAULT 0,
    cells             bigint           NOT NULL DEFAULT 0,
    cell_seconds      double precision NOT NULL DEFAULT 0,
    commands          bigint           NOT NULL DEFAULT 0,
    file_bytes_in     bigint           NOT NULL DEFAULT 0,
    file_bytes_out    bigint           NOT NULL DEFAULT 0,
    pool_hits         bigint           NOT NULL DEFAULT 0,
    PRIMARY KEY (hour, tenant, session)
);
CREATE INDEX kb_usage_tenant ON kb_usage (tenant, hour);
";

/// Version 2: the cluster's hop secret (a request forwarded by a node carries it; a client
/// cannot make a node believe a request was forwarded).
const V2: &str = "
CREATE TABLE kb_cluster (
    id         int  PRIMARY KEY CHECK (id = 1),
    hop_secret text NOT NULL
);
INSERT INTO kb_cluster VALUES (1,
    replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', ''));
";

/// Version 1: nodes and their epochs, sessions, kernels.
const V1: &str = "
CREATE SEQUENCE kb_epoch_seq AS bigint START 1 NO CYCLE;

CREATE TABLE kb_nodes (
    name         text        PRIMARY KEY,
    advertise    text        NOT NULL,
    epoch        bigint      NOT NULL,
    state        text        NOT NULL CHECK (state IN ('live', 'expired', 'left')),
    started_at   timestamptz NOT NULL DEFAULT now(),
    renewed_at   timestamptz NOT NULL DEFAULT now(),
    capacity     int         NOT NULL CHECK (capacity >= 0),
    live_kernels int         NOT NULL DEFAULT 0 CHECK (live_kernels >= 0),
    draining     bool        NOT NULL DEFAULT false
);

CREATE TABLE kb_sessions (
    tenant     text        NOT NULL,
    session    text        NOT NULL,
    node       text        NOT NULL,
    epoch      bigint      NOT NULL,
    live       bool        NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, session)
);
CREATE INDEX kb_sessions_node ON kb_sessions (node, epoch) WHERE live;
CREATE INDEX kb_sessions_tenant_live ON kb_sessions (tenant) WHERE live;

CREATE TABLE kb_kernels (
    key_hash   text        PRIMARY KEY,
    tenant     text        NOT NULL,
    owner      text        NOT NULL,
    session    text        NOT NULL,
    node       text        NOT NULL,
    epoch      bigint      NOT NULL,
    generation bigint      NOT NULL CHECK (generation >= 0),
    state      text        NOT NULL CHECK (state IN ('live', 'lost', 'ended')),
    reason     text,
    lost_at    timestamptz,
    changed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK ((state = 'lost') = (reason IS NOT NULL AND lost_at IS NOT NULL))
);
CREATE INDEX kb_kernels_session ON kb_kernels (tenant, session);
CREATE INDEX kb_kernels_node ON kb_kernels (node, epoch, state);
CREATE INDEX kb_kernels_tenant_live ON kb_kernels (tenant) WHERE state = 'live';
CREATE INDEX kb_kernels_tenant_changed ON kb_kernels (tenant, changed_at) WHERE state <> 'live';
";

/// Applies the migrations this database lacks, one transaction each.
pub(crate) async fn migrate(client: &mut deadpool_postgres::Object) -> Result<(), ClusterError> {
    let known = i32::try_from(MIGRATIONS.len()).unwrap_or(i32::MAX);
    for (index, sql) in MIGRATIONS.iter().enumerate() {
        let version = i32::try_from(index + 1).unwrap_or(i32::MAX);
        let tx = client.transaction().await.map_err(db("migrate: begin"))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(db("migrate: lock"))?;
        tx.batch_execute("CREATE TABLE IF NOT EXISTS kernelbox_schema (version int PRIMARY KEY)")
            .await
            .map_err(db("migrate: create kernelbox_schema"))?;
        let current: i32 = tx
            .query_one(
                "SELECT coalesce(max(version), 0) FROM kernelbox_schema",
                &[],
            )
            .await
            .map_err(db("migrate: read version"))?
            .try_get(0)
            .map_err(db("migrate: read version"))?;
        if current > known {
            return Err(ClusterError::SchemaTooNew {
                found: current,
                known,
            });
        }
        if current < version {
            tx.batch_execute(sql).await.map_err(db("migrate: apply"))?;
            tx.execute(
                "INSERT INTO kernelbox_schema (version) VALUES ($1)",
                &[&version],
            )
            .await
            .map_err(db("migrate: record version"))?;
        }
        tx.commit().await.map_err(db("migrate: commit"))?;
    }
    Ok(())
}
