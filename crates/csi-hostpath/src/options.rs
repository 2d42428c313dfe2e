//! Mount flags (`VolumeCapability.mount.mount_flags`, the PV's or StorageClass's
//! `mountOptions`) on the driver's bind mounts. Only the flags a bind mount carries for itself
//! are applied, each by a remount of that mount alone: `ro`/`rw`, `nosuid`/`suid`,
//! `nodev`/`dev`, `noexec`/`exec`, `noatime`/`relatime`/`strictatime` and
//! `nodiratime`/`diratime`. Any other flag (a filesystem's own option such as `discard` or
//! `uid=`, or `sync`, which would change the filesystem under every mount of it) is refused,
//! named. As with mount(8), the last of two contrary flags wins.
//!
//! A remount keeps the restrictions the mount already has (those it inherited from the state
//! directory's mount when it was bound, or a fence's read-only): `suid`, `dev`, `exec` and
//! `rw` undo an earlier contrary flag of the same list, never a restriction the machine set.
//! Read-only alone is dropped where asked (lifting a fence), never by a flag.

use serde::{Deserialize, Serialize};

use crate::error::DriverError;

/// The longest part of a refused flag its error message quotes.
const QUOTED_FLAG: usize = 64;

/// The flags csi-hostpath applies, as its error message lists them.
pub const APPLIED: &str = "ro, rw, nosuid, suid, nodev, dev, noexec, exec, noatime, relatime, strictatime, nodiratime, diratime";

/// How access times are updated (the three are exclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Atime {
    NoAtime,
    RelAtime,
    StrictAtime,
}

/// What a list of mount flags asks of a bind mount; the default asks nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountOptions {
    #[serde(default, skip_serializing_if = "is_false")]
    pub readonly: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub nosuid: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub nodev: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub noexec: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub atime: Option<Atime>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodiratime: Option<bool>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

impl MountOptions {
    /// Parses `flags` in order; `INVALID_ARGUMENT` naming the first flag not applied.
    pub fn parse<S: AsRef<str>>(flags: &[S]) -> Result<Self, DriverError> {
        let mut options = Self::default();
        for flag in flags {
            let flag = flag.as_ref();
            match flag {
                "ro" | "rw" => options.readonly = flag == "ro",
                "nosuid" | "suid" => options.nosuid = flag == "nosuid",
                "nodev" | "dev" => options.nodev = flag == "nodev",
                "noexec" | "exec" => options.noexec = flag == "noexec",
                "noatime" => options.atime = Some(Atime::NoAtime),
                "relatime" => options.atime = Some(Atime::RelAtime),
                "strictatime" => options.atime = Some(Atime::StrictAtime),
                "nodiratime" | "diratime" => options.nodiratime = Some(flag == "nodiratime"),
                other => {
                    let mut end = other.len().min(QUOTED_FLAG);
                    while !other.is_char_boundary(end) {
                        end -= 1;
                    }
                    return Err(DriverError::UnsupportedMountFlag {
                        flag: other[..end].to_string(),
                    });
                }
            }
        }
        Ok(options)
    }

    /// These options, read-only too when `readonly`.
    pub fn read_only_if(mut self, readonly: bool) -> Self {
        self.readonly |= readonly;
        self
    }

    /// Whether a bind mount needs a remount for these options.
    pub fn ask_anything(&self) -> bool {
        *self != Self::default()
    }

    /// The `mount(2)` flags of a bind remount that applies these options over a mount whose
    /// current flags (`statvfs`) are `current`, keeping its restrictions but read-only.
    pub fn remount_flags(
        &self,
        current: rustix::fs::StatVfsMountFlags,
    ) -> rustix::mount::MountFlags {
        use rustix::fs::StatVfsMountFlags as Has;
        use rustix::mount::MountFlags as Set;
        let mut flags = Set::BIND;
        for (wanted, has, set) in [
            (self.readonly, Has::empty(), Set::RDONLY),
            (self.nosuid, Has::NOSUID, Set::NOSUID),
            (self.nodev, Has::NODEV, Set::NODEV),
            (self.noexec, Has::NOEXEC, Set::NOEXEC),
        ] {
            if wanted || (!has.is_empty() && current.contains(has)) {
                flags |= set;
            }
        }
        // A remount naming no access-time flag would keep the current one, but one naming only
        // nodiratime would reset it: both are always given.
        let atime = self.atime.unwrap_or(if current.contains(Has::NOATIME) {
            Atime::NoAtime
        } else if current.contains(Has::RELATIME) {
            Atime::RelAtime
        } else {
            Atime::StrictAtime
        });
        flags |= match atime {
            Atime::NoAtime => Set::NOATIME,
            Atime::RelAtime => Set::RELATIME,
            Atime::StrictAtime => Set::STRICTATIME,
        };
        if self
            .nodiratime
            .unwrap_or_else(|| current.contains(Has::NODIRATIME))
        {
            flags |= Set::NODIRATIME;
        }
        flags
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::StatVfsMountFlags as Has;
    use rustix::mount::MountFlags as Set;
    use tonic::Code;

    #[test]
    fn flags_parse_in_order_and_the_last_of_two_contrary_ones_wins() {
        let parsed = |flags: &[&str]| MountOptions::parse(flags).unwrap();
        assert_eq!(parsed(&[]), MountOptions::default());
        assert!(!parsed(&[]).ask_anything());
        let all = parsed(&["ro", "nosuid", "nodev", "noexec", "noatime", "nodiratime"]);
        assert_eq!(
            all,
            MountOptions {
                readonly: true,
                nosuid: true,
                nodev: true,
                noexec: true,
                atime: Some(Atime::NoAtime),
                nodiratime: Some(true),
            }
        );
        assert_eq!(
            parsed(&[
                "ro", "nosuid", "nodev", "noexec", "rw", "suid", "dev", "exec"
            ]),
            MountOptions::default()
        );
        assert_eq!(
            parsed(&["noatime", "strictatime", "nodiratime", "diratime"]),
            MountOptions {
                atime: Some(Atime::StrictAtime),
                nodiratime: Some(false),
                ..MountOptions::default()
            }
        );
        assert!(!parsed(&["rw"]).ask_anything());
        assert!(parsed(&["relatime"]).ask_anything());
    }

    #[test]
    fn other_flags_are_refused_by_name() {
        for flag in [
            "discard",
            "sync",
            "bind",
            "rbind",
            "remount",
            "uid=0",
            "context=\"system_u:object_r:x\"",
            "defaults",
            "",
            " ro",
            "RO",
        ] {
            let error = MountOptions::parse(&["ro", flag]).unwrap_err();
            assert_eq!(error.code(), Code::InvalidArgument, "{flag:?}");
            let message = error.to_string();
            assert!(message.contains(&format!("{flag:?}")), "{message}");
            assert!(message.contains(APPLIED), "{message}");
        }
        let long = "x".repeat(5000);
        let message = MountOptions::parse(&[long]).unwrap_err().to_string();
        assert!(message.len() < 300, "{message}");
    }

    #[test]
    fn a_remount_keeps_the_mount_s_restrictions_but_read_only() {
        let nothing = MountOptions::default();
        // A bind mount of a directory on a nosuid, nodev, read-only, noatime mount.
        let restricted = Has::NOSUID | Has::NODEV | Has::RDONLY | Has::NOATIME;
        assert_eq!(
            nothing.remount_flags(restricted),
            Set::BIND | Set::NOSUID | Set::NODEV | Set::NOATIME
        );
        let relaxed = MountOptions::parse(&["suid", "dev", "rw", "strictatime"]).unwrap();
        assert_eq!(
            relaxed.remount_flags(restricted),
            Set::BIND | Set::NOSUID | Set::NODEV | Set::STRICTATIME
        );
        let asked = MountOptions::parse(&["ro", "noexec", "nodiratime"]).unwrap();
        assert_eq!(
            asked.remount_flags(Has::RELATIME),
            Set::BIND | Set::RDONLY | Set::NOEXEC | Set::RELATIME | Set::NODIRATIME
        );
        assert_eq!(
            nothing.read_only_if(true).remount_flags(Has::NODIRATIME),
            Set::BIND | Set::RDONLY | Set::STRICTATIME | Set::NODIRATIME
        );
    }
}
