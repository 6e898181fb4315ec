//! Sessions' settings (`src/settings.rs`) in the registry's books: kept per tenant and
//! session under the registry's one lock, so that the reaper reads a session's idle timeout
//! and a new slot records the settings its kernel starts with in the same critical section
//! as its admission.

use std::sync::Arc;

use super::{Inner, Registry};
use crate::owner::Owner;
use crate::settings::{Settings, SettingsError, MAX_SESSIONS_PER_TENANT};

/// The settings of one session, and when they were set (an increasing count).
#[derive(Debug)]
pub(super) struct Kept {
    pub(super) settings: Arc<Settings>,
    set_at: u64,
}

impl Inner {
    /// The settings of `owner`'s session, if it has any.
    pub(super) fn settings_of(&self, owner: &Owner) -> Option<Arc<Settings>> {
        self.settings
            .get(&(owner.tenant.clone(), owner.session.clone()))
            .map(|k| k.settings.clone())
    }

    /// True when a live slot belongs to `tenant`'s `session`.
    fn session_live(&self, tenant: &str, session: &str) -> bool {
        self.slots
            .keys()
            .any(|k| k.owner.tenant == tenant && k.owner.session == session)
    }
}

impl Registry {
    /// Sets `tenant`'s `session`'s settings (replacing any). Returns true when a live kernel
    /// of the session was started with another environment, memory or CPU (they apply from
    /// its next kernel). A tenant holding [`MAX_SESSIONS_PER_TENANT`] sessions' settings
    /// forgets those of its sessions with no live kernel first, least recently set; when all
    /// have one, the new session's are refused.
    pub fn set_settings(
        &self,
        tenant: &str,
        session: &str,
        settings: Settings,
    ) -> Result<bool, SettingsError> {
        let mut inner = self.lock();
        let id = (tenant.to_string(), session.to_string());
        if !inner.settings.contains_key(&id) {
            let held = inner.settings.keys().filter(|(t, _)| t == tenant).count();
            if held >= MAX_SESSIONS_PER_TENANT {
                let oldest = inner
                    .settings
                    .iter()
                    .filter(|((t, s), _)| t == tenant && !inner.session_live(t, s))
                    .min_by_key(|(_, kept)| kept.set_at)
                    .map(|(id, _)| id.clone());
                match oldest {
                    Some(id) => {
                        inner.settings.remove(&id);
                    }
                    None => {
                        return Err(SettingsError::TooMany {
                            tenant: tenant.to_string(),
                        })
                    }
                }
            }
        }
        let empty = Settings::default();
        let restart = inner
            .slots
            .values()
            .filter(|s| s.key.owner.tenant == tenant && s.key.owner.session == session)
            .any(|s| {
                s.settings
                    .as_deref()
                    .unwrap_or(&empty)
                    .start_differs(&settings)
            });
        inner.settings_seq += 1;
        let set_at = inner.settings_seq;
        inner.settings.insert(
            id,
            Kept {
                settings: Arc::new(settings),
                set_at,
            },
        );
        Ok(restart)
    }

    /// `tenant`'s `session`'s settings, if it has any.
    pub fn settings(&self, tenant: &str, session: &str) -> Option<Arc<Settings>> {
        self.lock()
            .settings
            .get(&(tenant.to_string(), session.to_string()))
            .map(|k| k.settings.clone())
    }
}
