//! Where rollouts are recorded, so that a restarted gateway resumes the
//! step it had reached and never serves shares past it.
//!
//! [`RolloutStore`] is the boundary: standalone mode records them in a file
//! of `--state-dir` ([`FileStore`]); without a place to keep them they live
//! in memory ([`MemoryStore`]). A store for Kubernetes keeps them in each
//! policy's `status.rollouts`, in the same shape ([`RolloutStatus`]).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::machine::{PolicyKey, Rollout, StepCounts};
use super::status::RolloutStatus;

/// Keeps recorded rollouts across restarts.
pub trait RolloutStore: Send {
    /// Everything recorded (nothing on a first start).
    fn load(&mut self) -> Result<Vec<Rollout>, String>;
    /// Record `rollouts`, the complete set, replacing what was recorded.
    fn save(&mut self, rollouts: &[Rollout]) -> Result<(), String>;
    /// Where, for messages: a file path, or `memory`.
    fn location(&self) -> String;
}

/// Rollouts kept in memory only: lost on restart.
#[derive(Debug, Default)]
pub struct MemoryStore {
    rollouts: Vec<Rollout>,
}

impl RolloutStore for MemoryStore {
    fn load(&mut self) -> Result<Vec<Rollout>, String> {
        Ok(self.rollouts.clone())
    }

    fn save(&mut self, rollouts: &[Rollout]) -> Result<(), String> {
        self.rollouts = rollouts.to_vec();
        Ok(())
    }

    fn location(&self) -> String {
        "memory".into()
    }
}

/// The state file's name in the state directory.
pub const STATE_FILE: &str = "rollouts.json";

/// Rollouts recorded in `DIR/rollouts.json`, written atomically (a
/// temporary file synced and renamed over it, then the directory synced),
/// so that a crash leaves the old file or the new one, never half of one.
#[derive(Debug, Clone)]
pub struct FileStore {
    dir: PathBuf,
}

#[derive(Serialize, Deserialize)]
struct StateFile {
    version: u32,
    rollouts: Vec<StateEntry>,
}

#[derive(Serialize, Deserialize)]
struct StateEntry {
    policy: PolicyKey,
    #[serde(flatten)]
    status: RolloutStatus,
}

impl FileStore {
    pub fn new(dir: impl Into<PathBuf>) -> FileStore {
        FileStore { dir: dir.into() }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// Read the records without a store to write them (for `sluice check`):
    /// `Ok(None)` when there is no state file.
    pub fn read(dir: &Path) -> Result<Option<Vec<Rollout>>, String> {
        let path = dir.join(STATE_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        let file: StateFile = serde_json::from_str(&text)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if file.version != 1 {
            return Err(format!(
                "{}: version {} is not one this sluice reads (1)",
                path.display(),
                file.version
            ));
        }
        file.rollouts
            .iter()
            .map(|e| e.status.rollout(&e.policy))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display()))
    }
}

impl RolloutStore for FileStore {
    /// A file that cannot be read is moved aside (`rollouts.json.unreadable`)
    /// so that the next save does not destroy it; the error says so.
    fn load(&mut self) -> Result<Vec<Rollout>, String> {
        match FileStore::read(&self.dir) {
            Ok(records) => Ok(records.unwrap_or_default()),
            Err(error) => {
                let path = self.path();
                let aside = path.with_extension("json.unreadable");
                match std::fs::rename(&path, &aside) {
                    Ok(()) => Err(format!("{error} (moved to {})", aside.display())),
                    Err(_) => Err(error),
                }
            }
        }
    }

    fn save(&mut self, rollouts: &[Rollout]) -> Result<(), String> {
        let file = StateFile {
            version: 1,
            rollouts: rollouts
                .iter()
                .map(|r| StateEntry {
                    policy: r.policy.clone(),
                    status: RolloutStatus::new(r, None, StepCounts::default()),
                })
                .collect(),
        };
        let mut text = serde_json::to_vec_pretty(&file).map_err(|e| e.to_string())?;
        text.push(b'\n');
        let path = self.path();
        let fail = |what: &str, e: std::io::Error| format!("cannot {what} {}: {e}", path.display());
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("cannot create {}: {e}", self.dir.display()))?;
        let tmp = self
            .dir
            .join(format!(".{STATE_FILE}.{}.tmp", std::process::id()));
        let written = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&text)?;
            f.sync_all()
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(fail("write", e));
        }
        if let Err(e) = std::fs::rename(&tmp, &path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(fail("replace", e));
        }
        // The rename is durable once the directory is synced (where the
        // platform can open a directory for that).
        if let Ok(dir) = std::fs::File::open(&self.dir) {
            let _ = dir.sync_all();
        }
        Ok(())
    }

    fn location(&self) -> String {
        self.path().display().to_string()
    }
}

/// The default state directory: `$XDG_STATE_HOME/sluice`, else
/// `~/.local/state/sluice`; `None` when neither is known.
pub fn default_state_dir() -> Option<PathBuf> {
    let xdg = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    match xdg {
        Some(dir) => Some(dir.join("sluice")),
        None => std::env::var_os("HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .map(|home| home.join(".local/state/sluice")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Percent;
    use crate::rollout::{BackendKey, Phase, RuleKey, Weights};
    use crate::route::RouteKind;

    fn rollout(step: &str) -> Rollout {
        let mut from = Weights::new();
        from.add(BackendKey::service("default", "stable", Some(8080)), 1000);
        let mut to = Weights::new();
        to.add(BackendKey::service("default", "canary", Some(8080)), 1);
        Rollout {
            policy: PolicyKey {
                namespace: "default".into(),
                name: "p".into(),
            },
            rule: RuleKey {
                kind: RouteKind::Http,
                namespace: "default".into(),
                route: "r".into(),
                rule: 0,
            },
            rule_name: None,
            phase: Phase::Progressing,
            step: Percent::parse(step).ok(),
            step_started_at: "2024-05-01T10:00:00.123456Z".parse().ok(),
            from,
            to,
            held_for: None,
            message: "at a step".into(),
        }
    }

    #[test]
    fn the_file_store_saves_and_loads_atomically() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut store = FileStore::new(dir.path().join("nested/state"));
        assert_eq!(store.load(), Ok(Vec::new()), "no file: a first start");
        store.save(&[rollout("5%")]).expect("saves");
        store.save(&[rollout("25%")]).expect("saves again");
        assert_eq!(store.load(), Ok(vec![rollout("25%")]));
        let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("nested/state"))
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(leftovers, [STATE_FILE], "no temporary file left");
    }

    #[test]
    fn an_unwritable_directory_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("a-file");
        std::fs::write(&file, "x").expect("write");
        let mut store = FileStore::new(file.join("state"));
        let e = store
            .save(&[rollout("5%")])
            .expect_err("a file is in the way");
        assert!(e.contains("cannot create"), "{e}");
    }

    #[test]
    fn a_corrupt_file_is_reported_and_kept_aside() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join(STATE_FILE), "{not json").expect("write");
        let mut store = FileStore::new(dir.path());
        let e = store.load().expect_err("corrupt");
        assert!(e.contains(STATE_FILE) && e.contains("moved to"), "{e}");
        let aside = dir.path().join("rollouts.json.unreadable");
        assert_eq!(std::fs::read_to_string(aside).expect("kept"), "{not json");
        assert_eq!(store.load(), Ok(Vec::new()), "then a first start");
    }
}
