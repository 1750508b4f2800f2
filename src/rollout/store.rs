//! Where rollouts are recorded, so that a restarted gateway resumes the
//! step it had reached and never serves shares past it.
//!
//! [`RolloutStore`] is the boundary: standalone mode records them in a file
//! of `--state-dir` ([`FileStore`]); without a place to keep them they live
//! in memory ([`MemoryStore`]). A store for Kubernetes keeps them in each
//! policy's `status.rollouts`, in the same shape ([`RolloutStatus`]).
//!
//! A state directory belongs to one configuration: the state file names
//! the manifest paths it was recorded for, and a file recorded for other
//! paths is set aside, never resumed (two gateways sharing a directory
//! would otherwise ramp each other's routes). The default directory is
//! already one per configuration ([`state_dir_for`]). The directory carries
//! a marker file ([`STATE_MARKER`]) so that the file source never reads it
//! as manifests, wherever it is ([`is_state_dir`]).

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

/// The marker file of a state directory: the file source skips any
/// directory that holds one, so a state directory inside the manifests is
/// never read as manifests.
pub const STATE_MARKER: &str = ".sluice-state";

/// Whether `dir` is a sluice state directory (it holds [`STATE_MARKER`]).
pub fn is_state_dir(dir: &Path) -> bool {
    dir.join(STATE_MARKER).is_file()
}

/// The configuration a state file belongs to: the manifest paths, made
/// absolute (and canonical where they exist), sorted.
pub fn configuration_of(paths: &[PathBuf]) -> Vec<String> {
    let cwd = std::env::current_dir().unwrap_or_default();
    let mut out: Vec<String> = paths
        .iter()
        .map(|p| {
            std::fs::canonicalize(p)
                .unwrap_or_else(|_| cwd.join(p))
                .display()
                .to_string()
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// What reading a state directory found.
#[derive(Debug)]
pub enum StateRead {
    /// No state file.
    Absent,
    /// Records of this configuration.
    Records(Vec<Rollout>),
    /// A state file recorded for another configuration (the paths it
    /// names, empty for a file from before files named them): not resumed.
    OtherConfiguration(Vec<String>),
}

/// Rollouts recorded in `DIR/rollouts.json`, written atomically (a
/// temporary file synced and renamed over it, then the directory synced),
/// so that a crash leaves the old file or the new one, never half of one.
#[derive(Debug, Clone)]
pub struct FileStore {
    dir: PathBuf,
    configuration: Vec<String>,
}

#[derive(Serialize, Deserialize)]
struct StateFile {
    version: u32,
    /// The manifest paths the records belong to ([`configuration_of`]).
    #[serde(default)]
    manifests: Vec<String>,
    rollouts: Vec<StateEntry>,
}

#[derive(Serialize, Deserialize)]
struct StateEntry {
    policy: PolicyKey,
    #[serde(flatten)]
    status: RolloutStatus,
}

impl FileStore {
    /// The store of `dir` for the configuration read from `configuration`
    /// (see [`configuration_of`]).
    pub fn new(dir: impl Into<PathBuf>, configuration: Vec<String>) -> FileStore {
        FileStore {
            dir: dir.into(),
            configuration,
        }
    }

    /// Mark the directory as a state directory ([`STATE_MARKER`]), creating
    /// it if needed, so that no file source reads it as manifests.
    pub fn claim(&self) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("cannot create {}: {e}", self.dir.display()))?;
        let marker = self.dir.join(STATE_MARKER);
        if marker.is_file() {
            return Ok(());
        }
        std::fs::write(
            &marker,
            "sluice's rollout state directory: sluice does not read it as manifests.\n",
        )
        .map_err(|e| format!("cannot write {}: {e}", marker.display()))
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// Read the records without a store to write them (for `sluice check`),
    /// keeping only a file recorded for `configuration`.
    pub fn read(dir: &Path, configuration: &[String]) -> Result<StateRead, String> {
        let path = dir.join(STATE_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(StateRead::Absent),
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
        if file.manifests != configuration {
            return Ok(StateRead::OtherConfiguration(file.manifests));
        }
        file.rollouts
            .iter()
            .map(|e| e.status.rollout(&e.policy))
            .collect::<Result<Vec<_>, _>>()
            .map(StateRead::Records)
            .map_err(|e| format!("{}: {e}", path.display()))
    }
}

impl RolloutStore for FileStore {
    /// A file that cannot be read is moved aside (`rollouts.json.unreadable`)
    /// so that the next save does not destroy it; the error says so.
    /// A file recorded for another configuration is moved aside too
    /// (`rollouts.json.other-configuration`), with a log line saying so.
    fn load(&mut self) -> Result<Vec<Rollout>, String> {
        match FileStore::read(&self.dir, &self.configuration) {
            Ok(StateRead::Absent) => Ok(Vec::new()),
            Ok(StateRead::Records(records)) => Ok(records),
            Ok(StateRead::OtherConfiguration(theirs)) => {
                let path = self.path();
                let aside = path.with_extension("json.other-configuration");
                let moved = std::fs::rename(&path, &aside);
                tracing::warn!(
                    state = %path.display(),
                    recorded_for = ?theirs,
                    serving = ?self.configuration,
                    set_aside = %aside.display(),
                    moved = moved.is_ok(),
                    "rollout records of another configuration set aside, not resumed"
                );
                Ok(Vec::new())
            }
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
            manifests: self.configuration.clone(),
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
        self.claim()?;
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

/// The default state directory of the configuration read from `paths`:
/// one per configuration under [`default_state_dir`], named after the first
/// path's last component and a hash of [`configuration_of`] (FNV-1a, stable
/// across builds), e.g. `~/.local/state/sluice/examples-5b1f0c2e9a4d7736`.
pub fn state_dir_for(paths: &[PathBuf]) -> Option<PathBuf> {
    let configuration = configuration_of(paths);
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in configuration.join("\n").bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let name: String = configuration
        .first()
        .and_then(|p| {
            Path::new(p)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
        })
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    let name = if name.is_empty() {
        "manifests".to_string()
    } else {
        name
    };
    default_state_dir().map(|base| base.join(format!("{name}-{hash:016x}")))
}

/// The base of the default state directories: `$XDG_STATE_HOME/sluice`,
/// else `~/.local/state/sluice`; `None` when neither is known.
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
        let mut store = FileStore::new(dir.path().join("nested/state"), ours());
        assert_eq!(store.load(), Ok(Vec::new()), "no file: a first start");
        store.save(&[rollout("5%")]).expect("saves");
        store.save(&[rollout("25%")]).expect("saves again");
        assert_eq!(store.load(), Ok(vec![rollout("25%")]));
        let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("nested/state"))
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        let mut leftovers = leftovers;
        leftovers.sort();
        assert_eq!(
            leftovers,
            [STATE_MARKER, STATE_FILE],
            "the marker and the state, no temporary file left"
        );
    }

    #[test]
    fn an_unwritable_directory_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("a-file");
        std::fs::write(&file, "x").expect("write");
        let mut store = FileStore::new(file.join("state"), ours());
        let e = store
            .save(&[rollout("5%")])
            .expect_err("a file is in the way");
        assert!(e.contains("cannot create"), "{e}");
    }

    #[test]
    fn a_corrupt_file_is_reported_and_kept_aside() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join(STATE_FILE), "{not json").expect("write");
        let mut store = FileStore::new(dir.path(), ours());
        let e = store.load().expect_err("corrupt");
        assert!(e.contains(STATE_FILE) && e.contains("moved to"), "{e}");
        let aside = dir.path().join("rollouts.json.unreadable");
        assert_eq!(std::fs::read_to_string(aside).expect("kept"), "{not json");
        assert_eq!(store.load(), Ok(Vec::new()), "then a first start");
    }

    fn ours() -> Vec<String> {
        vec!["/srv/gateway/manifests".to_string()]
    }

    #[test]
    fn records_of_another_configuration_are_set_aside_not_resumed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut first = FileStore::new(dir.path(), vec!["/srv/first".to_string()]);
        first.save(&[rollout("25%")]).expect("saves");
        let mut second = FileStore::new(dir.path(), vec!["/srv/second".to_string()]);
        assert_eq!(
            second.load(),
            Ok(Vec::new()),
            "nothing of the first resumed"
        );
        let aside = dir.path().join("rollouts.json.other-configuration");
        assert!(aside.is_file(), "the first one's records are kept aside");
        assert!(!dir.path().join(STATE_FILE).exists());
        // The first configuration's own store still reads its records back
        // from where they were set aside only if asked to: a fresh save and
        // load round-trips for the right configuration.
        first.save(&[rollout("5%")]).expect("saves");
        assert_eq!(first.load(), Ok(vec![rollout("5%")]));
    }

    #[test]
    fn a_state_file_naming_no_configuration_is_not_resumed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut old = FileStore::new(dir.path(), ours());
        old.save(&[rollout("25%")]).expect("saves");
        // As written before state files named their manifests.
        let path = dir.path().join(STATE_FILE);
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
        json.as_object_mut().expect("object").remove("manifests");
        std::fs::write(&path, json.to_string()).expect("write");
        match FileStore::read(dir.path(), &ours()).expect("readable") {
            StateRead::OtherConfiguration(theirs) => assert!(theirs.is_empty()),
            other => panic!("expected another configuration, got {other:?}"),
        }
    }

    #[test]
    fn each_configuration_has_its_own_default_directory() {
        let a = configuration_of(&[PathBuf::from("/srv/a/manifests")]);
        assert_eq!(a, ["/srv/a/manifests"]);
        let b = configuration_of(&[PathBuf::from("/srv/b"), PathBuf::from("/srv/a")]);
        assert_eq!(
            b,
            ["/srv/a", "/srv/b"],
            "sorted: order on the command line does not matter"
        );
        // SAFETY of the test: XDG_STATE_HOME is read, not relied on, here;
        // the names differ by their hash whatever the base.
        let one = state_dir_for(&[PathBuf::from("/srv/a/manifests")]);
        let two = state_dir_for(&[PathBuf::from("/srv/b/manifests")]);
        if let (Some(one), Some(two)) = (one, two) {
            assert_ne!(one, two);
            assert_eq!(one.parent(), two.parent());
            let name = one
                .file_name()
                .expect("name")
                .to_string_lossy()
                .into_owned();
            assert!(
                name.starts_with("manifests-") && name.len() == "manifests-".len() + 16,
                "{name}"
            );
            assert_eq!(
                Some(one),
                state_dir_for(&[PathBuf::from("/srv/a/manifests")]),
                "stable"
            );
        }
    }
}
