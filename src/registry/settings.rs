//! Sessions' settings (`src/settings.rs`) in the registry's books: kept per tenant and
//! session under the registry's one lock, so that the reaper reads a session's idle timeout
//! and a new slot records the settings its kernel starts with in the same critical section
//! as its admission. Bounded per tenant by count and by bytes; looked up without allocating.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::{Inner, Registry};
use crate::owner::Owner;
use crate::settings::{
    Settings, SettingsError, MAX_SESSIONS_PER_TENANT, MAX_SETTINGS_BYTES_PER_TENANT,
};

/// The settings of one session as it set them, what its kernels run with (under its
/// tenant's ceiling), and when they were set (an increasing count).
#[derive(Debug)]
pub(super) struct Kept {
    pub(super) settings: Arc<Settings>,
    effective: Arc<Settings>,
    set_at: u64,
    /// The cluster catalog's version of the settings (0 on one host): an older one never
    /// replaces a newer (`src/cluster/store/config.rs`).
    version: u64,
}

/// One tenant's sessions' settings and the bytes they hold.
#[derive(Debug, Default)]
pub(super) struct TenantSettings {
    sessions: HashMap<String, Kept>,
    bytes: usize,
}

impl TenantSettings {
    /// Makes room for `session`'s new settings of `size` bytes: the bytes the tenant then
    /// holds, and which `spare` sessions (oldest first) to forget for it; `None` when even
    /// forgetting all of them leaves the tenant past its bounds and the settings are not
    /// `forced`.
    fn room_for(
        &self,
        session: &str,
        size: usize,
        spare: Vec<(u64, String, usize)>,
        forced: bool,
    ) -> Option<(usize, Vec<String>)> {
        let replaced = self.sessions.get(session).map_or(0, |k| k.settings.bytes());
        let new = usize::from(!self.sessions.contains_key(session));
        let mut count = self.sessions.len() + new;
        let mut bytes = self.bytes - replaced + size;
        let mut forget = Vec::new();
        for (_, name, held) in spare {
            if count <= MAX_SESSIONS_PER_TENANT && bytes <= MAX_SETTINGS_BYTES_PER_TENANT {
                break;
            }
            count -= 1;
            bytes -= held;
            forget.push(name);
        }
        if !forced && (count > MAX_SESSIONS_PER_TENANT || bytes > MAX_SETTINGS_BYTES_PER_TENANT) {
            return None;
        }
        Some((bytes, forget))
    }
}

impl Inner {
    /// True when nothing is to be set: a newer version of `session`'s settings is kept, or
    /// the call forgets them (`forget`), which it then has done.
    fn settings_newer_or_forgotten(
        &mut self,
        tenant: &str,
        session: &str,
        forget: bool,
        version: u64,
    ) -> bool {
        let Some(mine) = self.settings.get_mut(tenant) else {
            return forget;
        };
        match mine.sessions.get(session) {
            Some(kept) if kept.version > version => true,
            Some(kept) if forget => {
                mine.bytes -= kept.settings.bytes();
                mine.sessions.remove(session);
                true
            }
            _ => forget,
        }
    }

    /// True when a live kernel of `tenant`'s `session` was started with another environment,
    /// memory or CPU than `effective`.
    fn restart_needed(&self, tenant: &str, session: &str, effective: &Settings) -> bool {
        let empty = Settings::default();
        self.slots
            .values()
            .filter(|s| s.key.owner.tenant == tenant && s.key.owner.session == session)
            .any(|s| {
                s.settings
                    .as_deref()
                    .unwrap_or(&empty)
                    .start_differs(effective)
            })
    }

    /// What may be forgotten to make room for `session`'s settings: `tenant`'s other sessions
    /// with no kernel here and no start holding them, as (set at, session, bytes), oldest
    /// first.
    fn spare_settings(&self, tenant: &str, session: &str) -> Vec<(u64, String, usize)> {
        let live: HashSet<&str> = self
            .slots
            .keys()
            .filter(|k| k.owner.tenant == tenant)
            .map(|k| k.owner.session.as_str())
            .chain(
                self.held_configs
                    .keys()
                    .filter(|(t, _)| t == tenant)
                    .map(|(_, s)| s.as_str()),
            )
            .collect();
        let mut spare: Vec<(u64, String, usize)> = self
            .settings
            .get(tenant)
            .map(|t| {
                t.sessions
                    .iter()
                    .filter(|(s, _)| s.as_str() != session && !live.contains(s.as_str()))
                    .map(|(s, k)| (k.set_at, s.clone(), k.settings.bytes()))
                    .collect()
            })
            .unwrap_or_default();
        spare.sort();
        spare
    }

    /// The settings `owner`'s session's kernels run with: its own under its tenant's ceiling,
    /// else the ceiling (a tenant's `session_limits` below the server's defaults cap a session
    /// that sets nothing too; `docs/http-api.md`, "Session settings").
    pub(super) fn settings_of(&self, owner: &Owner) -> Option<Arc<Settings>> {
        match self
            .settings
            .get(&owner.tenant)
            .and_then(|t| t.sessions.get(&owner.session))
        {
            Some(kept) => Some(kept.effective.clone()),
            None => self.ceilings.get(&owner.tenant).cloned(),
        }
    }
}

impl Registry {
    /// Holds `tenant`'s `session`'s settings and network policy here until
    /// [`Registry::release_config`]: a start loaded them and its kernel is not registered yet
    /// (its request's body may still be arriving), so they are not forgotten to make room
    /// for another session's ([`Registry::keeps_config`]).
    pub fn hold_config(&self, tenant: &str, session: &str) {
        *self
            .lock()
            .held_configs
            .entry((tenant.to_string(), session.to_string()))
            .or_insert(0) += 1;
    }

    /// Ends one [`Registry::hold_config`].
    pub fn release_config(&self, tenant: &str, session: &str) {
        let mut inner = self.lock();
        let key = (tenant.to_string(), session.to_string());
        if let Some(n) = inner.held_configs.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                inner.held_configs.remove(&key);
            }
        }
    }

    /// True when `tenant`'s `session`'s settings and network policy must stay here: a kernel
    /// of it is registered, or a start holds them ([`Registry::hold_config`]).
    pub fn keeps_config(&self, tenant: &str, session: &str) -> bool {
        let inner = self.lock();
        inner
            .held_configs
            .contains_key(&(tenant.to_string(), session.to_string()))
            || inner
                .slots
                .keys()
                .any(|k| k.owner.tenant == tenant && k.owner.session == session)
    }

    /// Sets what a session of each tenant runs with where it sets nothing
    /// ([`crate::settings::Limits::ceiling`]), before any kernel starts.
    pub fn set_ceilings(&self, ceilings: HashMap<String, Settings>) {
        self.lock().ceilings = ceilings
            .into_iter()
            .map(|(t, s)| (t, Arc::new(s)))
            .collect();
    }

    /// Sets `tenant`'s `session`'s settings (replacing any). Returns true when a live kernel
    /// of the session was started with another environment, memory or CPU (they apply from
    /// its next kernel). A tenant past [`MAX_SESSIONS_PER_TENANT`] sessions or
    /// [`MAX_SETTINGS_BYTES_PER_TENANT`] bytes of settings forgets those of its sessions with
    /// no live kernel first, least recently set; when that is not enough, the new settings
    /// are refused and the old ones kept.
    pub fn set_settings(
        &self,
        tenant: &str,
        session: &str,
        settings: Settings,
    ) -> Result<bool, SettingsError> {
        self.set_settings_at(tenant, session, Some(settings), 0, false)
    }

    /// [`Registry::set_settings`] at the cluster catalog's `version` (`None` forgets the
    /// session's settings): nothing changes when a newer version is kept; `forced` keeps
    /// them even when nothing more can be forgotten to make room (the catalog, their home on
    /// a cluster node, bounded them).
    pub fn set_settings_at(
        &self,
        tenant: &str,
        session: &str,
        settings: Option<Settings>,
        version: u64,
        forced: bool,
    ) -> Result<bool, SettingsError> {
        let mut inner = self.lock();
        if inner.settings_newer_or_forgotten(tenant, session, settings.is_none(), version) {
            return Ok(false);
        }
        let Some(settings) = settings else {
            return Ok(false);
        };
        let effective = match inner.ceilings.get(tenant) {
            Some(ceiling) => settings.under(ceiling),
            None => settings.clone(),
        };
        let restart = inner.restart_needed(tenant, session, &effective);
        let spare = inner.spare_settings(tenant, session);
        inner.settings_seq += 1;
        let set_at = inner.settings_seq;
        let mine = inner.settings.entry(tenant.to_string()).or_default();
        let Some((bytes, forget)) = mine.room_for(session, settings.bytes(), spare, forced) else {
            return Err(SettingsError::TooMany {
                tenant: tenant.to_string(),
            });
        };
        for name in forget {
            mine.sessions.remove(&name);
        }
        mine.bytes = bytes;
        mine.sessions.insert(
            session.to_string(),
            Kept {
                settings: Arc::new(settings),
                effective: Arc::new(effective),
                set_at,
                version,
            },
        );
        Ok(restart)
    }

    /// Forgets the settings of all of `tenant`'s sessions (the tenant was removed by a reload,
    /// its kernels first: a tenant added back under its name starts with none).
    pub fn forget_tenant_settings(&self, tenant: &str) {
        self.lock().settings.remove(tenant);
    }

    /// `tenant`'s `session`'s settings, if it has any.
    pub fn settings(&self, tenant: &str, session: &str) -> Option<Arc<Settings>> {
        self.lock()
            .settings
            .get(tenant)?
            .sessions
            .get(session)
            .map(|k| k.settings.clone())
    }
}
