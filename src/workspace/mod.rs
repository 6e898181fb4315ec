//! Workspaces: a session's `/work` kept past its kernel (`docs/workspaces.md`).
//!
//! A workspace is a Docker volume labelled `io.kernelbox.role=workspace`, named from a hash of
//! its tenant and owner (a tenant cannot name another's), mounted from a loop device over an
//! ext4 image of the tenant's quota. It carries no instance labels: no sweep of dead instances
//! or watchdog removes it; only its deletion or the reaper's TTL sweep does, and never while a
//! container uses it.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Workspaces`]: prepare one for a kernel, list, delete, the TTL sweep; its errors |
//! | `disk.rs` | the image file, its file system and loop device, its last use, its generation's stamp |
//! | `ledger.rs` | [`Ledger`]: which node holds each workspace at which generation, in a cluster |

mod disk;
mod ledger;

pub use ledger::{Ledger, Opening, Placed};

pub use disk::DeviceHold;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub use crate::wire::WorkspaceSummary;

use sha2::{Digest, Sha256};

use crate::clock::unix_now;
use crate::config::{WorkspacePolicy, WorkspacesConfig};
use crate::docker::{remove_volume, Engine, EngineError, InUse, VolumeInfo};
use crate::labels;
use crate::owner::Owner;

/// The label naming a workspace volume's loop device (checked at each use: after a reboot
/// the image is attached again, maybe elsewhere, and the volume made anew).
pub const DEVICE_LABEL: &str = "io.kernelbox.workspace-device";

/// The label naming the images' directory a workspace volume belongs to (a hash of it): two
/// deployments (or tests) on one engine never see each other's workspaces.
pub const DIR_LABEL: &str = "io.kernelbox.workspace-dir";

/// Why a workspace operation failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// A file of the workspace could not be made, read or removed.
    #[error("workspace: cannot {op} {}: {source}", path.display())]
    Io {
        /// What was attempted.
        op: &'static str,
        /// The workspace file concerned.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A host tool (`mkfs.ext4`, `losetup`) failed.
    #[error("workspace: cannot {op}: {message}")]
    Tool {
        /// What was attempted.
        op: &'static str,
        /// The tool's complaint.
        message: String,
    },
    /// The engine refused.
    #[error("workspace: {0}")]
    Engine(#[from] EngineError),
    /// The tenant holds its maximum of workspaces.
    #[error("tenant {tenant} holds its maximum of {max} workspaces; delete one first")]
    TooMany {
        /// The tenant at its bound.
        tenant: String,
        /// How many workspaces the tenant may hold.
        max: usize,
    },
    /// No such workspace for this tenant.
    #[error("no workspace {name:?}")]
    NotFound {
        /// The name asked for.
        name: String,
    },
    /// A kernel still uses it.
    #[error("workspace {name:?} is in use by a kernel; evict the session first")]
    InUse {
        /// The workspace asked for.
        name: String,
    },
    /// The tenant has no workspaces.
    #[error("tenant {tenant} has no workspaces")]
    Disabled {
        /// The tenant that asked.
        tenant: String,
    },
    /// A new workspace would take the host's workspaces past their host-wide bound.
    #[error(
        "this host's workspaces hold {held} bytes of quota; one more of {quota} bytes would pass \
         the host-wide bound of {limit} bytes; delete a workspace first"
    )]
    HostFull {
        /// Quota bytes the workspaces of this host hold.
        held: u64,
        /// The new workspace's quota.
        quota: u64,
        /// The bound (`WorkspacesConfig::total_bytes`).
        limit: u64,
    },
    /// A kernel is starting on it (held from its opening until its container exists).
    #[error("workspace {name:?} is in use by a kernel that is starting; retry once it runs, or evict the session first")]
    Starting {
        /// The workspace asked for.
        name: String,
    },
    /// The engine's volume of that name is not the workspace (missing, or not made by
    /// kernelbox): no kernel starts on it.
    #[error("workspace volume {volume} is missing or not kernelbox's workspace; the kernel was not started")]
    NotOurs {
        /// The engine volume the workspace should be.
        volume: String,
    },
    /// The cluster's ledger of workspaces could not be read or written.
    #[error("workspace ledger: cannot {op}: {reason}")]
    Ledger {
        /// What was attempted.
        op: &'static str,
        /// Why it failed.
        reason: String,
    },
}

/// A workspace ready for a kernel: the volume to mount at `/work`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// The engine's volume.
    pub volume: String,
    /// What the result reports.
    pub info: crate::cell::WorkspaceInfo,
    /// Which opening of the workspace this is (each [`Workspaces::open`] counts one): what
    /// [`Workspaces::delete_unless_reopened`] checks.
    pub opening: u64,
    /// Its loop device, held until the kernel's container is started (its mount then holds
    /// it); dropped, the device goes once no mount uses it (`docs/workspaces.md`, "Quota").
    pub device: DeviceHold,
    /// Holds the workspace against deletion and the sweeps until dropped: kept until the
    /// kernel's container exists (it then pins the volume itself).
    pub hold: Hold,
    /// The engine's label filters the workspace's volume matches (what [`verify`] checks).
    filters: Vec<String>,
}

/// Workspaces held by kernels being started, by volume (how many starts hold each).
type Holds = Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>;

/// A workspace held by a start (see [`Prepared::hold`]); released when the last clone goes.
#[derive(Clone)]
pub struct Hold(Arc<HoldInner>);

struct HoldInner {
    holds: Holds,
    volume: String,
}

impl Drop for HoldInner {
    fn drop(&mut self) {
        let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = holds.get_mut(&self.volume) {
            *n -= 1;
            if *n == 0 {
                holds.remove(&self.volume);
            }
        }
    }
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Hold").field(&self.0.volume).finish()
    }
}

/// Holds are not part of what a prepared workspace is.
impl PartialEq for Hold {
    fn eq(&self, _: &Hold) -> bool {
        true
    }
}

impl Eq for Hold {}

/// Checks, once the kernel's container exists (and so pins its volumes), that the volume it
/// mounts at `/work` is `prepared`'s workspace: a volume of that name made by kernelbox with
/// the workspace's labels and device. A volume the engine made by itself (its name asked for
/// after the workspace's went) has none of them: the kernel must not start on it.
pub async fn verify(engine: &dyn Engine, prepared: &Prepared) -> Result<(), WorkspaceError> {
    let found = engine.list_volumes(&prepared.filters, false).await?;
    let ours = found
        .iter()
        .any(|v| v.name == prepared.volume && v.labels.contains_key(DEVICE_LABEL));
    if ours {
        Ok(())
    } else {
        Err(WorkspaceError::NotOurs {
            volume: prepared.volume.clone(),
        })
    }
}

/// The workspaces of this host.
pub struct Workspaces {
    engine: Arc<dyn Engine>,
    config: WorkspacesConfig,
    /// The tenants' policies as now: `config.tenants` at start, replaced by a reload of the
    /// tenants (`Workspaces::set_policies`; `docs/http-api.md`, "Reloading the tenants").
    policies: arc_swap::ArcSwap<BTreeMap<String, WorkspacePolicy>>,
    /// The most quota bytes all images may add up to (`WorkspacesConfig::total_bytes`, or
    /// what the directory's disk holds for them at start).
    total_bytes: u64,
    /// Labels every workspace volume carries besides its own (the configured extras).
    extra_labels: BTreeMap<String, String>,
    /// One change at a time: a sweep never deletes what a start is preparing, two starts
    /// never make the same workspace twice.
    lock: tokio::sync::Mutex<()>,
    /// Openings counted (`.0`) and each volume's last (`.1`; one entry per workspace, gone
    /// with it).
    openings: std::sync::Mutex<(u64, std::collections::HashMap<String, u64>)>,
    /// Workspaces held by starts ([`Hold`]): never deleted or swept while held.
    holds: Holds,
    /// The cluster's ledger, on a cluster node ([`Workspaces::set_ledger`]).
    ledger: std::sync::OnceLock<Arc<dyn Ledger>>,
}

/// The short hash of an images' directory ([`DIR_LABEL`]).
fn dir_hash(dir: &std::path::Path) -> String {
    hex::encode(Sha256::digest(dir.as_os_str().as_encoded_bytes()))[..16].to_string()
}

/// The volume name of `owner`'s workspace in the images' directory `dir`: a hash of the
/// three, so no tenant can name (or guess its way to) another's.
pub fn volume_name(dir: &std::path::Path, tenant: &str, owner: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"workspace\0");
    h.update(dir.as_os_str().as_encoded_bytes());
    h.update([0]);
    h.update(tenant.as_bytes());
    h.update([0]);
    h.update(owner.as_bytes());
    format!("kernelbox-ws-{}", &hex::encode(h.finalize())[..32])
}

impl Workspaces {
    /// The workspaces of `config` on `engine`; creates the images' directory (mode 0700).
    pub fn new(
        engine: Arc<dyn Engine>,
        config: WorkspacesConfig,
        extra_labels: BTreeMap<String, String>,
    ) -> Result<Workspaces, WorkspaceError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&config.dir)
            .map_err(|source| WorkspaceError::Io {
                op: "create the workspaces' directory",
                path: config.dir.clone(),
                source,
            })?;
        let total_bytes = Self::host_bound(&config);
        Ok(Workspaces {
            engine,
            policies: arc_swap::ArcSwap::from_pointee(config.tenants.clone()),
            config,
            total_bytes,
            extra_labels,
            lock: tokio::sync::Mutex::new(()),
            openings: std::sync::Mutex::default(),
            holds: Holds::default(),
            ledger: std::sync::OnceLock::new(),
        })
    }

    /// The host-wide bound on the images' quota bytes (`docs/reliability.md`, "Workspace disks
    /// and tars"): the configured one, else what the directory's file system holds for them
    /// now (its free bytes plus what the images already take). Warns when the tenants'
    /// quotas, or the configured bound, are more than that.
    fn host_bound(config: &WorkspacesConfig) -> u64 {
        let images = disk::images(&config.dir);
        let taken: u64 = images.iter().map(|(_, used)| used).sum();
        let Some(free) = disk::free_bytes(&config.dir) else {
            tracing::warn!(dir = %config.dir.display(), "cannot read the free space of the workspaces' directory");
            return config.total_bytes.unwrap_or(u64::MAX);
        };
        let room = free.saturating_add(taken);
        let allowed: u64 = config
            .tenants
            .values()
            .map(|p| p.quota_bytes.saturating_mul(p.max as u64))
            .fold(0, u64::saturating_add);
        let bound = config.total_bytes.unwrap_or(room);
        if allowed > room {
            tracing::warn!(
                dir = %config.dir.display(),
                quotas = allowed,
                free = room,
                bound,
                "the tenants' workspace quotas add up to more than the workspaces' directory has free; new workspaces past the host-wide bound are refused"
            );
        }
        if bound > room {
            tracing::warn!(
                dir = %config.dir.display(),
                bound,
                free = room,
                "the host-wide workspace bound is more than the workspaces' directory has free"
            );
        }
        bound
    }

    /// The host-wide bound on the workspaces' quota bytes in force.
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// Refuses a new workspace of `quota` bytes past the host-wide bound.
    fn check_host_bound(&self, quota: u64) -> Result<(), WorkspaceError> {
        let held: u64 = disk::images(&self.config.dir)
            .iter()
            .map(|(size, _)| size)
            .sum();
        if held.saturating_add(quota) > self.total_bytes {
            return Err(WorkspaceError::HostFull {
                held,
                quota,
                limit: self.total_bytes,
            });
        }
        Ok(())
    }

    /// Makes these the workspaces of a cluster node: `ledger` says which node holds each
    /// workspace at which generation, and counts each tenant's (set once, before serving).
    pub fn set_ledger(&self, ledger: Arc<dyn Ledger>) {
        if self.ledger.set(ledger).is_err() {
            tracing::warn!("the workspaces' ledger is already set");
        }
    }

    /// True while a start holds the volume (`Hold`).
    fn held(&self, volume: &str) -> bool {
        self.holds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(volume)
    }

    /// A hold of `volume` for a start.
    fn hold(&self, volume: &str) -> Hold {
        *self
            .holds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(volume.to_string())
            .or_insert(0) += 1;
        Hold(Arc::new(HoldInner {
            holds: self.holds.clone(),
            volume: volume.to_string(),
        }))
    }

    /// The label filters of `tenant`'s workspace volumes in this images' directory.
    fn filters(&self, tenant: Option<&str>) -> Vec<String> {
        let mut filters = vec![
            labels::managed(),
            labels::filter(labels::ROLE, "workspace"),
            labels::filter(DIR_LABEL, &dir_hash(&self.config.dir)),
        ];
        if let Some(tenant) = tenant {
            filters.push(labels::filter(labels::TENANT, tenant));
        }
        filters
    }

    /// `tenant`'s policy as now, when it has workspaces.
    pub fn policy(&self, tenant: &str) -> Option<WorkspacePolicy> {
        self.policies.load().get(tenant).copied()
    }

    /// The tenants' policies from now on (a reload of the tenants): a tenant given workspaces
    /// has them on its sessions' next kernels; a new quota sizes the workspaces made from
    /// then on (an existing image keeps its size), a new TTL and maximum apply at once; a
    /// tenant whose workspaces are gone keeps its images, never swept, until it has them again
    /// or they are deleted by hand.
    pub fn set_policies(&self, tenants: BTreeMap<String, WorkspacePolicy>) {
        self.policies.store(Arc::new(tenants));
    }

    fn labels(&self, owner: &Owner, device: &str) -> BTreeMap<String, String> {
        let mut l = self.extra_labels.clone();
        l.insert(labels::MANAGED_BY.into(), labels::MANAGED_BY_VALUE.into());
        l.insert(labels::ROLE.into(), "workspace".into());
        l.insert(labels::TENANT.into(), owner.tenant.clone());
        l.insert(labels::OWNER.into(), owner.to_string());
        l.insert(labels::SESSION.into(), owner.session.clone());
        l.insert(labels::CREATED_AT.into(), unix_now().to_string());
        l.insert(DEVICE_LABEL.into(), device.to_string());
        l.insert(DIR_LABEL.into(), dir_hash(&self.config.dir));
        l
    }

    /// Workspace volumes (of `tenant` when given), and which of them no container uses.
    async fn volumes(
        &self,
        tenant: Option<&str>,
    ) -> Result<(Vec<VolumeInfo>, std::collections::BTreeSet<String>), WorkspaceError> {
        let filters = self.filters(tenant);
        let all = self.engine.list_volumes(&filters, false).await?;
        let free = self
            .engine
            .list_volumes(&filters, true)
            .await?
            .into_iter()
            .map(|v| v.name)
            .collect();
        Ok((all, free))
    }

    /// `owner`'s workspace ready to mount, made now (empty, of `policy`'s quota, its root
    /// owned by `uid:gid`) when it has none; `restored` says it was there before.
    pub async fn prepare(
        &self,
        owner: &Owner,
        policy: &WorkspacePolicy,
        uid: u64,
        gid: u64,
    ) -> Result<Prepared, WorkspaceError> {
        self.open(owner, policy, uid, gid, true).await
    }

    /// `owner`'s workspace ready to mount, as [`Self::prepare`] makes it; without `create`,
    /// one that does not exist is [`WorkspaceError::NotFound`] (nothing is made).
    pub async fn open(
        &self,
        owner: &Owner,
        policy: &WorkspacePolicy,
        uid: u64,
        gid: u64,
        create: bool,
    ) -> Result<Prepared, WorkspaceError> {
        let _one = self.lock.lock().await;
        let name = owner.to_string();
        let volume = volume_name(&self.config.dir, &owner.tenant, &name);
        let image = disk::image_path(&self.config.dir, &volume);
        let local = image.exists().then(|| disk::stamped(&image).unwrap_or(0));
        let (restored, generation) = match self.ledger.get() {
            None => {
                self.open_here(owner, policy, &volume, local, create)
                    .await?
            }
            Some(ledger) => {
                self.open_placed(ledger.as_ref(), owner, policy, &volume, local, create)
                    .await?
            }
        };
        if !restored {
            self.make_image(owner, &image, policy.quota_bytes, uid, gid, generation)
                .await?;
        }
        let device = self
            .stamp_and_mount(owner, &volume, &image, local, restored, generation)
            .await?;
        disk::touch(&image)?;
        let opening = {
            let mut openings = self.openings.lock().unwrap_or_else(|p| p.into_inner());
            openings.0 += 1;
            let n = openings.0;
            openings.1.insert(volume.clone(), n);
            n
        };
        let hold = self.hold(&volume);
        let filters = self.filters(Some(&owner.tenant));
        Ok(Prepared {
            volume,
            info: crate::cell::WorkspaceInfo {
                name: owner.to_string(),
                restored,
            },
            opening,
            device,
            hold,
            filters,
        })
    }

    /// On a cluster node: the ledger's word on `owner`'s workspace, (restored, generation).
    /// Files of another generation here (a node that came back after its workspaces were made
    /// anew elsewhere) are dropped, never served as this one.
    async fn open_placed(
        &self,
        ledger: &dyn Ledger,
        owner: &Owner,
        policy: &WorkspacePolicy,
        volume: &str,
        local: Option<u64>,
        create: bool,
    ) -> Result<(bool, u64), WorkspaceError> {
        let name = owner.to_string();
        match ledger
            .open(&owner.tenant, &name, local, create, policy.max)
            .await?
        {
            Opening::Current { generation } => Ok((true, generation)),
            Opening::Fresh { generation } => {
                if local.is_some() {
                    tracing::info!(workspace = %name, volume = %volume, "a stale image of the workspace is dropped");
                    if let Err(e) = self.destroy(volume).await {
                        self.forget(owner, Some(generation)).await;
                        return Err(e);
                    }
                }
                Ok((false, generation))
            }
            Opening::NotFound => {
                if local.is_some() {
                    let _ = self.destroy(volume).await;
                }
                Err(WorkspaceError::NotFound { name })
            }
            Opening::TooMany => Err(WorkspaceError::TooMany {
                tenant: owner.tenant.clone(),
                max: policy.max,
            }),
        }
    }

    /// A new workspace's image of `quota` bytes, within the host's bound; on failure its
    /// generation is given back.
    async fn make_image(
        &self,
        owner: &Owner,
        image: &Path,
        quota: u64,
        uid: u64,
        gid: u64,
        generation: u64,
    ) -> Result<(), WorkspaceError> {
        let made = match self.check_host_bound(quota) {
            Ok(()) => disk::create(image, quota, uid, gid).await,
            Err(e) => Err(e),
        };
        if made.is_err() {
            self.forget(owner, Some(generation)).await;
        }
        made
    }

    /// The image stamped with its generation (when it changed or is new) and mounted: the
    /// device to mount. A new workspace that cannot be mounted is removed and its
    /// generation given back.
    async fn stamp_and_mount(
        &self,
        owner: &Owner,
        volume: &str,
        image: &Path,
        local: Option<u64>,
        restored: bool,
        generation: u64,
    ) -> Result<DeviceHold, WorkspaceError> {
        let made = async {
            if local != Some(generation) || !restored {
                disk::stamp(image, generation)?;
            }
            self.mount_point(owner, volume, image).await
        }
        .await;
        if made.is_err() && !restored {
            let _ = disk::destroy(image).await;
            self.forget(owner, Some(generation)).await;
        }
        made
    }

    /// On one host (no ledger): whether `owner`'s workspace is there (`local`: its image's
    /// stamp), and its generation; one that is not is counted against the tenant's maximum
    /// by the volumes of this host.
    async fn open_here(
        &self,
        owner: &Owner,
        policy: &WorkspacePolicy,
        volume: &str,
        local: Option<u64>,
        create: bool,
    ) -> Result<(bool, u64), WorkspaceError> {
        if let Some(generation) = local {
            return Ok((true, generation.max(1)));
        }
        if !create {
            return Err(WorkspaceError::NotFound {
                name: owner.to_string(),
            });
        }
        let (existing, _) = self.volumes(Some(&owner.tenant)).await?;
        if existing.iter().filter(|v| v.name != volume).count() >= policy.max {
            return Err(WorkspaceError::TooMany {
                tenant: owner.tenant.clone(),
                max: policy.max,
            });
        }
        Ok((false, 1))
    }

    /// Tells the ledger (if any) that this node no longer holds `owner`'s workspace at
    /// `generation` (logged when it cannot: the node's own images are checked again at every
    /// sweep and opening).
    async fn forget(&self, owner: &Owner, generation: Option<u64>) {
        self.forget_name(&owner.tenant, &owner.to_string(), generation)
            .await;
    }

    async fn forget_name(&self, tenant: &str, name: &str, generation: Option<u64>) {
        let Some(ledger) = self.ledger.get() else {
            return;
        };
        if let Err(e) = ledger.forget(tenant, name, generation).await {
            tracing::warn!(workspace = %name, error = %e, "the ledger could not forget a deleted workspace");
        }
    }

    /// Deletes `owner`'s workspace when nothing opened it since `opening` (a kernel's start,
    /// another transfer) and no container uses it: a workspace made for an upload that failed
    /// goes, one anybody else touched meanwhile stays. True when it was deleted.
    pub async fn delete_unless_reopened(
        &self,
        owner: &Owner,
        opening: u64,
    ) -> Result<bool, WorkspaceError> {
        let _one = self.lock.lock().await;
        let volume = volume_name(&self.config.dir, &owner.tenant, &owner.to_string());
        let last = self
            .openings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .get(&volume)
            .copied();
        if last != Some(opening) || self.held(&volume) {
            return Ok(false);
        }
        let generation = disk::stamped(&disk::image_path(&self.config.dir, &volume));
        match self.destroy(&volume).await {
            Ok(()) => {
                self.forget(owner, generation).await;
                Ok(true)
            }
            Err(WorkspaceError::Engine(EngineError::VolumeInUse { .. })) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The volume of the image `image` attached, and its device held: made, or made anew
    /// when it names another loop device than the image's (the device the volume names is
    /// asked for first, so that is rare: another image took it while this one was idle).
    async fn mount_point(
        &self,
        owner: &Owner,
        volume: &str,
        image: &std::path::Path,
    ) -> Result<DeviceHold, WorkspaceError> {
        let (existing, _) = self.volumes(Some(&owner.tenant)).await?;
        let named = existing
            .iter()
            .find(|v| v.name == volume)
            .and_then(|v| v.labels.get(DEVICE_LABEL).cloned());
        let (device, hold) = disk::attach(image, named.as_deref()).await?;
        // `named` is the device of a volume of that name with our labels, if there is one.
        if named.as_ref() == Some(&device) {
            return Ok(hold);
        }
        // A volume of that name that is not this workspace's on this device (another device
        // after a reboot, or one the engine made by itself without our labels) goes first:
        // creating a volume whose name exists keeps the old one.
        remove_volume(self.engine.as_ref(), volume, InUse::Fail).await?;
        self.engine
            .create_device_volume(volume, &self.labels(owner, &device), &device, "ext4")
            .await?;
        Ok(hold)
    }

    /// `tenant`'s workspaces.
    pub async fn list(&self, tenant: &str) -> Result<Vec<WorkspaceSummary>, WorkspaceError> {
        let policy = self
            .policy(tenant)
            .ok_or_else(|| WorkspaceError::Disabled {
                tenant: tenant.to_string(),
            })?;
        let (all, free) = self.volumes(Some(tenant)).await?;
        // On a cluster node, only the workspaces the ledger places here at the generation of
        // their image: a stale image is not a workspace (the sweep drops it).
        let current = match self.ledger.get() {
            Some(ledger) => Some(ledger.here(Some(tenant)).await?),
            None => None,
        };
        let mut list: Vec<WorkspaceSummary> = all
            .into_iter()
            .filter_map(|v| {
                let name = v.labels.get(labels::OWNER)?.clone();
                let image = disk::image_path(&self.config.dir, &v.name);
                if let Some(current) = &current {
                    let stamp = disk::stamped(&image);
                    if !current
                        .iter()
                        .any(|p| p.owner == name && Some(p.generation) == stamp)
                    {
                        return None;
                    }
                }
                let in_use = !free.contains(&v.name);
                Some(WorkspaceSummary {
                    name,
                    size_bytes: disk::used_bytes(&image),
                    quota_bytes: std::fs::metadata(&image)
                        .map(|m| m.len())
                        .unwrap_or(policy.quota_bytes),
                    last_used: if in_use {
                        unix_now()
                    } else {
                        disk::last_used(&image)
                    },
                    in_use,
                })
            })
            .collect();
        list.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(list)
    }

    /// Deletes `tenant`'s workspace `name` (its files are gone); refused while a kernel uses
    /// it. Another tenant's workspace of the same name is not this one: not found.
    pub async fn delete(&self, tenant: &str, name: &str) -> Result<(), WorkspaceError> {
        let _one = self.lock.lock().await;
        let volume = volume_name(&self.config.dir, tenant, name);
        let (all, _) = self.volumes(Some(tenant)).await?;
        let image = disk::image_path(&self.config.dir, &volume);
        if !all.iter().any(|v| v.name == volume) && !image.exists() {
            return Err(WorkspaceError::NotFound {
                name: name.to_string(),
            });
        }
        // A kernel starting on it holds it until its container exists (then the engine
        // refuses to remove a volume in use): deleting it meanwhile would leave the kernel a
        // `/work` that is not its workspace.
        if self.held(&volume) {
            return Err(WorkspaceError::Starting {
                name: name.to_string(),
            });
        }
        let generation = disk::stamped(&image);
        self.destroy(&volume).await.map_err(|e| match e {
            WorkspaceError::Engine(EngineError::VolumeInUse { .. }) => WorkspaceError::InUse {
                name: name.to_string(),
            },
            e => e,
        })?;
        self.forget_name(tenant, name, generation).await;
        Ok(())
    }

    /// Removes the volume (refused while in use), then its image.
    async fn destroy(&self, volume: &str) -> Result<(), WorkspaceError> {
        remove_volume(self.engine.as_ref(), volume, InUse::Fail).await?;
        self.openings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .remove(volume);
        disk::destroy(&disk::image_path(&self.config.dir, volume)).await
    }

    /// The reaper's sweep: workspaces unused for longer than their tenant's TTL are deleted;
    /// one a container uses is never touched (its use is recorded now instead). A tenant no
    /// longer configured keeps its workspaces (an operator deletes them). Returns the volumes
    /// deleted.
    pub async fn sweep_expired(&self) -> Result<Vec<String>, WorkspaceError> {
        let _one = self.lock.lock().await;
        let (all, free) = self.volumes(None).await?;
        let current = match self.ledger.get() {
            Some(ledger) => Some(ledger.here(None).await?),
            None => None,
        };
        let now = unix_now();
        let mut removed = Vec::new();
        for v in all {
            let image = disk::image_path(&self.config.dir, &v.name);
            if self.held(&v.name) {
                continue;
            }
            if let (Some(current), Some(stamp), false) =
                (&current, disk::stamped(&image), !free.contains(&v.name))
            {
                // A node that comes back drops the images of workspaces now held elsewhere
                // (or deleted meanwhile): another generation's files are never a workspace.
                let placed = current.iter().any(|p| {
                    Some(&p.tenant) == v.labels.get(labels::TENANT)
                        && Some(&p.owner) == v.labels.get(labels::OWNER)
                        && p.generation == stamp
                });
                if !placed {
                    match self.destroy(&v.name).await {
                        Ok(()) => {
                            tracing::info!(volume = %v.name, "a stale workspace image was dropped");
                            removed.push(v.name);
                        }
                        Err(WorkspaceError::Engine(EngineError::VolumeInUse { .. })) => {}
                        Err(e) => tracing::warn!(volume = %v.name, error = %e, "stale workspace"),
                    }
                    continue;
                }
            }
            if !free.contains(&v.name) {
                if image.exists() {
                    disk::touch(&image)?;
                }
                continue;
            }
            let Some(policy) = v.labels.get(labels::TENANT).and_then(|t| self.policy(t)) else {
                continue;
            };
            let idle = Duration::from_secs(now.saturating_sub(disk::last_used(&image)));
            if idle <= policy.ttl {
                continue;
            }
            let stamp = disk::stamped(&image);
            match self.destroy(&v.name).await {
                Ok(()) => {
                    if let (Some(tenant), Some(owner)) =
                        (v.labels.get(labels::TENANT), v.labels.get(labels::OWNER))
                    {
                        self.forget_name(tenant, owner, stamp).await;
                    }
                    removed.push(v.name)
                }
                // A kernel took it since the listing: it is live.
                Err(WorkspaceError::Engine(EngineError::VolumeInUse { .. })) => {}
                Err(e) => tracing::warn!(volume = %v.name, error = %e, "workspace sweep"),
            }
        }
        Ok(removed)
    }

    /// Sets when `tenant`'s workspace `name` was last used (a test ages a workspace so).
    pub fn set_last_used(
        &self,
        tenant: &str,
        name: &str,
        at: SystemTime,
    ) -> Result<(), WorkspaceError> {
        let image = disk::image_path(
            &self.config.dir,
            &volume_name(&self.config.dir, tenant, name),
        );
        disk::set_last_used(&image, at)
    }
}
