//! Attaching to an owner's live kernel without ever starting one: file transfers hold the
//! kernel like a cell does, but only a kernel that is already up.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::time::Instant;

use super::{Refusal, Registry, Slot, MAX_ATTACHED_PER_SLOT};
use crate::owner::Owner;

impl Registry {
    /// The files volume `key`'s owner's contexts share (`docs/contract.md`, "Languages"): the
    /// one at the `/work` of a live strict-mode kernel of the owner's other than `key`'s;
    /// `None` when it has none (or a workspace is its `/work`).
    pub fn files_volume(&self, key: &crate::owner::KernelKey) -> Option<String> {
        if key.mode != crate::config::WorkMode::Strict {
            return None;
        }
        self.lock()
            .slots
            .values()
            .filter(|s| {
                s.key.owner == key.owner
                    && s.key != *key
                    && s.key.mode == crate::config::WorkMode::Strict
            })
            .filter_map(|s| s.kernel.get())
            .filter(|k| k.is_alive())
            .find_map(|k| k.files_volume().map(str::to_string))
    }

    /// True when `owner` has a live kernel (one that is up).
    pub fn has_live(&self, owner: &Owner) -> bool {
        self.lock()
            .slots
            .values()
            .any(|s| &s.key.owner == owner && s.kernel.get().is_some_and(|k| k.is_alive()))
    }

    /// Attaches a call to the owner's live kernel, whatever its key's tools (the most
    /// recently used when it has several); `None` when it has none (no slot, or one whose
    /// kernel is still starting or dead). The attach holds the kernel like a cell does: the
    /// reaper leaves it alone until [`Registry::release`], which touches its last use. A slot
    /// with [`MAX_ATTACHED_PER_SLOT`] calls refuses one more.
    pub fn attach_live(&self, owner: &Owner) -> Result<Option<Arc<Slot>>, Refusal> {
        let inner = self.lock();
        if inner.closed {
            return Ok(None);
        }
        let slot = inner
            .slots
            .values()
            .filter(|s| &s.key.owner == owner)
            .filter(|s| s.kernel.get().is_some_and(|k| k.is_alive()))
            .max_by_key(|s| s.last_used())
            .cloned();
        let Some(slot) = slot else { return Ok(None) };
        if slot.attached() >= MAX_ATTACHED_PER_SLOT {
            return Err(Refusal::Busy {
                owner: owner.to_string(),
                max: MAX_ATTACHED_PER_SLOT,
            });
        }
        slot.attached.fetch_add(1, Ordering::AcqRel);
        *slot.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        Ok(Some(slot))
    }
}
