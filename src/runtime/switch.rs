//! The kill switch (Charon): while it is on, every rejection becomes a grant, still counted
//! as `shadow_rejected`, so a misbehaving limit can be neutralized at once without editing
//! every limit.
//!
//! It has two inputs: `server.kill_switch` in the config (set at each load and reload) and
//! the runtime switch the admin API flips. It is on while either is: the config's switch
//! wins over an admin `off`, so that the file stays the source of truth for what a restart
//! does. One switch is shared by every runtime a process builds, so a reload keeps the
//! admin's setting. Reading it is one relaxed atomic load per decision phase.

use std::sync::atomic::{AtomicBool, Ordering};

/// The process's kill switch.
#[derive(Debug, Default)]
pub struct KillSwitch {
    config: AtomicBool,
    admin: AtomicBool,
}

impl KillSwitch {
    /// Whether rejections are turned into grants now.
    pub fn on(&self) -> bool {
        self.config.load(Ordering::Relaxed) || self.admin.load(Ordering::Relaxed)
    }

    /// The config's `server.kill_switch`, set when a config is loaded.
    pub fn set_config(&self, on: bool) {
        self.config.store(on, Ordering::Relaxed);
    }

    /// The runtime switch (admin API).
    pub fn set_admin(&self, on: bool) {
        self.admin.store(on, Ordering::Relaxed);
    }

    /// Whether the admin API turned it on.
    pub fn admin_on(&self) -> bool {
        self.admin.load(Ordering::Relaxed)
    }

    /// Whether the config turned it on (an admin `off` cannot turn that off).
    pub fn config_on(&self) -> bool {
        self.config.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn either_input_turns_it_on() {
        let k = KillSwitch::default();
        assert!(!k.on());
        k.set_admin(true);
        assert!(k.on());
        k.set_admin(false);
        k.set_config(true);
        assert!(k.on() && k.config_on());
        k.set_admin(false);
        assert!(k.on(), "the config's switch wins over an admin off");
    }
}
