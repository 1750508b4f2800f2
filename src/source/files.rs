//! The standalone file source: reads manifest files and watches them.
//!
//! `sluice serve -f PATH...` takes files and directories; directories are
//! read recursively for `*.yaml`, `*.yml` and `*.json` (hidden entries
//! skipped, so a Kubernetes ConfigMap mount's `..data` copies are not read
//! twice). Every change notification triggers a full rescan: the listing
//! and contents go to [`FileSet`], which parses only what changed. Bursts of
//! events (an editor's write-rename-chmod) are debounced into one reload:
//! a write that is known to be complete (a file closed after writing, a
//! file renamed into place) is read after [`SETTLE`], anything else once
//! the events have stopped for [`DEBOUNCE`] (a file still being written is
//! never read half-way: its close comes last).
//!
//! Directories are watched recursively (new subdirectories included). A
//! configured path that does not exist yet is reported on `/errors` and its
//! parent directory is watched: when it appears as a directory it is read
//! and watched from then on, and so is a directory deleted and created again.
//!
//! [`run`] is the source as a task: it sends each configuration on a
//! channel to the serve loop, the way the Kubernetes source does, so that
//! both modes start and reload through one path.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};

use crate::metrics::Metrics;
use crate::resources::crd::Crds;
use crate::resources::{Generations, Snapshot};

use super::merge::{FileRead, FileSet};
use super::{ConfigError, SourceUpdate};

/// Quiet time after the last file event before a reload starts.
const DEBOUNCE: Duration = Duration::from_millis(150);
/// Quiet time after an event that completes a write (close after writing,
/// rename into place): the rest of the burst (a chmod, the next file of a
/// `kubectl cp`) still coalesces, and a flip is served within milliseconds
/// (docs/performance.md, the flip row).
const SETTLE: Duration = Duration::from_millis(3);
/// Longest a continuous stream of events can delay a reload.
const MAX_DEBOUNCE: Duration = Duration::from_secs(1);
/// Deepest directory nesting read (guards against symlink loops).
const MAX_DEPTH: usize = 32;

const MANIFEST_EXTENSIONS: [&str; 3] = ["yaml", "yml", "json"];

/// Manifests read from files, with each file's last good objects.
pub struct FileSource {
    paths: Vec<PathBuf>,
    /// `--crds`: only their CustomResourceDefinitions are read.
    crd_paths: Vec<PathBuf>,
    files: FileSet,
    generations: Generations,
    metrics: Arc<Metrics>,
    /// Errors of the previous update, to log and count only new ones.
    reported: Vec<ConfigError>,
    /// Configured paths that could not be listed at the previous reload.
    path_problems: Vec<ConfigError>,
    loaded_once: bool,
    /// `serve --ingress-class`: Ingresses served through the conversion.
    ingresses: Option<IngressServing>,
}

/// `serve --ingress-class NAME --ingress-gateway NS/NAME`: the Ingresses
/// of that class among the manifests are converted as `sluice convert
/// ingress-nginx --gateway NS/NAME` converts them, in process, at every
/// reload, and their routes served with the rest. The report's inexact
/// lines are configuration errors (logs, `/errors`).
#[derive(Debug, Clone)]
pub struct IngressServing {
    pub class: String,
    pub gateway: (String, String),
}

/// The file name the converted objects and the report's lines carry.
pub const INGRESS_CONVERSION: &str = "(ingress-nginx conversion)";

impl FileSource {
    pub fn new(paths: Vec<PathBuf>, metrics: Arc<Metrics>) -> Self {
        FileSource {
            paths,
            crd_paths: Vec::new(),
            files: FileSet::new(),
            generations: Generations::default(),
            metrics,
            reported: Vec::new(),
            path_problems: Vec::new(),
            loaded_once: false,
            ingresses: None,
        }
    }

    /// Serve the Ingresses of a class through the conversion.
    pub fn with_ingresses(mut self, serving: Option<IngressServing>) -> Self {
        self.ingresses = serving;
        self
    }

    /// Also read the CustomResourceDefinitions of `crd_paths` (files or
    /// directories, watched like the manifests): objects of the kinds they
    /// define are validated by them.
    pub fn with_crds(mut self, crd_paths: Vec<PathBuf>) -> Self {
        self.crd_paths = crd_paths;
        self
    }

    /// Read every file again. Returns the new configuration, or `None` when
    /// nothing changed since the previous call (the first call always
    /// returns one). Blocking: call it off the async workers.
    pub fn reload(&mut self) -> Option<SourceUpdate> {
        let crd_listing = read_all(&self.crd_paths);
        let listing = read_all(&self.paths);
        let ingress_input = self
            .ingresses
            .as_ref()
            .map(|_| ingress_input(&listing.reads));
        let crds_changed = self.files.update_crd_files(crd_listing.reads);
        let changed = self.files.update(listing.reads) || crds_changed;
        let mut errors = crd_listing.problems;
        errors.extend(listing.problems);
        if !changed && self.loaded_once && errors == self.path_problems {
            return None;
        }
        self.loaded_once = true;
        self.path_problems = errors.clone();

        let (loaded, mut specs, file_errors) = self.files.merged_with_specs();
        errors.extend(file_errors);
        let mut converted = Vec::new();
        if let (Some(serving), Some((input, read_errors))) = (&self.ingresses, ingress_input) {
            let (objects, conversion_errors, _) =
                converted_ingresses(serving, &input, &self.files.crds());
            // Converted at every reload: their specs are serialized here
            // (one per object, as for the files' own).
            specs.extend(objects.iter().map(|l| l.object.spec_json().into()));
            converted = objects;
            errors.extend(read_errors);
            errors.extend(conversion_errors);
        }
        for error in errors.iter().filter(|e| !self.reported.contains(e)) {
            tracing::warn!(file = %error.file, line = ?error.line, "configuration error: {error}");
            self.metrics.record_config_error(&error.file);
        }
        self.reported = errors.clone();

        let count = loaded.len() + converted.len();
        let generations = &mut self.generations;
        let snapshot =
            Snapshot::from_loaded_refs(loaded.into_iter().chain(&converted), |objects| {
                generations.assign_with_specs(objects, &specs, k8s_openapi::jiff::Timestamp::now());
            });
        Some(SourceUpdate {
            snapshot,
            errors,
            objects: count,
        })
    }

    /// Start watching the configured paths. Events are coalesced by
    /// [`FileWatch::changed`].
    pub fn watch(&self) -> notify::Result<FileWatch> {
        let (tx, rx) = mpsc::unbounded_channel();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let relevant = match &event {
                Ok(event) => is_change(&event.kind).then(|| completes_write(&event.kind)),
                Err(error) => {
                    // Lost events (queue overflow...): a rescan repairs it.
                    tracing::warn!(%error, "file watch error; rescanning");
                    Some(false)
                }
            };
            if let Some(complete) = relevant {
                // The receiver is gone only when the gateway shut down.
                let _ = tx.send(complete);
            }
        })?;
        let paths: Vec<PathBuf> = self.paths.iter().chain(&self.crd_paths).cloned().collect();
        let mut watch = FileWatch {
            watcher,
            events: rx,
            paths: paths.clone(),
            watched_dirs: vec![None; paths.len()],
            watched_parents: Vec::new(),
        };
        for (i, path) in paths.iter().enumerate() {
            match dir_identity(path) {
                Some(identity) => {
                    watch.watcher.watch(path, RecursiveMode::Recursive)?;
                    watch.watched_dirs[i] = Some(identity);
                }
                // A file, or a path that does not exist yet. Watch the
                // directory, not the file: an editor that replaces the file
                // by renaming a new one over it would leave a watch on the
                // old inode deaf. A path that appears later as a directory
                // is watched from then on ([`FileWatch::changed`]).
                None => watch.watch_parent(path)?,
            }
        }
        Ok(watch)
    }
}

/// Run the file source until `shutdown` turns true or `updates` is closed:
/// send the configuration read now, then a new one after every change
/// that changes it. Reading happens off the async workers; sending waits
/// for the serve loop to take the previous update (changes meanwhile are
/// read at the next one).
pub async fn run(
    source: FileSource,
    mut watch: FileWatch,
    updates: mpsc::Sender<SourceUpdate>,
    mut shutdown: watch::Receiver<bool>,
) {
    let source = Arc::new(Mutex::new(source));
    // The first read always yields a configuration; if reading panicked,
    // an empty one (nothing was served before), so that the gateway
    // starts and the next change is read again.
    let first = read(&source).await.unwrap_or_else(|| SourceUpdate {
        snapshot: Snapshot::default(),
        errors: Vec::new(),
        objects: 0,
    });
    let mut next = Some(first);
    loop {
        if let Some(update) = next.take() {
            tokio::select! {
                sent = updates.send(update) => if sent.is_err() { return },
                _ = crate::shutdown::stopped(&mut shutdown) => return,
            }
        }
        let changed = tokio::select! {
            changed = watch.changed() => changed,
            _ = crate::shutdown::stopped(&mut shutdown) => return,
        };
        if !changed {
            tracing::warn!("file watch stopped; configuration is no longer reloaded");
            return;
        }
        next = read(&source).await;
    }
}

/// Read the files again (off the async workers). `None` when nothing
/// changed, or when reading panicked: that is logged, the current table
/// keeps serving and the next change is tried again.
async fn read(source: &Arc<Mutex<FileSource>>) -> Option<SourceUpdate> {
    let source = source.clone();
    let result = tokio::task::spawn_blocking(move || {
        // A previous reload that panicked poisoned the lock; the source's
        // state is still a consistent last-good set, so go on with it.
        source
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .reload()
    })
    .await;
    match result {
        Ok(update) => update,
        Err(error) => {
            tracing::error!(%error, "reading the manifests failed; keeping the current configuration");
            None
        }
    }
}

/// Identity (device, inode) of `path` when it is a directory, to tell a
/// directory replaced by a new one from the one already watched.
fn dir_identity(path: &Path) -> Option<(u64, u64)> {
    let meta = std::fs::metadata(path).ok().filter(|m| m.is_dir())?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some((meta.dev(), meta.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        Some((0, 0))
    }
}

/// The directory holding `path` (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// Whether a file event can change what the manifests say. Opening and
/// reading (which the source itself does on every reload) cannot.
fn is_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// Whether a change event ends a write, so the file can be read now: a
/// file closed after writing, or renamed into place (an atomic replace).
fn completes_write(kind: &EventKind) -> bool {
    use notify::event::{ModifyKind, RenameMode};
    matches!(
        kind,
        EventKind::Access(AccessKind::Close(AccessMode::Write))
            | EventKind::Modify(ModifyKind::Name(RenameMode::To | RenameMode::Both))
    )
}

/// A live watch on the manifest paths.
pub struct FileWatch {
    watcher: RecommendedWatcher,
    /// One per change event: whether it completes a write.
    events: mpsc::UnboundedReceiver<bool>,
    /// The configured paths.
    paths: Vec<PathBuf>,
    /// For each configured path, the directory watched recursively there
    /// (see [`dir_identity`]), if any.
    watched_dirs: Vec<Option<(u64, u64)>>,
    /// Directories watched (non-recursively) for a configured path in them
    /// to change, appear or disappear.
    watched_parents: Vec<PathBuf>,
}

impl FileWatch {
    /// Wait until the files changed and then stayed quiet for a moment.
    /// Returns `false` when the watch has stopped.
    ///
    /// Before returning, configured paths that became directories (a path
    /// missing at startup, a directory deleted and created again) are
    /// watched recursively. Files written there before that watch existed
    /// are not missed: the rescan that follows this call reads them.
    pub async fn changed(&mut self) -> bool {
        let Some(mut complete) = self.events.recv().await else {
            return false;
        };
        let deadline = tokio::time::Instant::now() + MAX_DEBOUNCE;
        loop {
            let wait = if complete { SETTLE } else { DEBOUNCE };
            let quiet = (tokio::time::Instant::now() + wait).min(deadline);
            match tokio::time::timeout_at(quiet, self.events.recv()).await {
                Ok(Some(c)) if tokio::time::Instant::now() < deadline => complete = c,
                Ok(Some(_)) | Err(_) => {
                    self.follow_directories();
                    return true;
                }
                Ok(None) => return false,
            }
        }
    }

    /// Watch each configured path that is now a directory other than the
    /// one watched there; when a watched directory is gone, watch its
    /// parent to hear it come back. Failures are logged and retried at the
    /// next change.
    fn follow_directories(&mut self) {
        for i in 0..self.paths.len() {
            let path = self.paths[i].clone();
            let now = dir_identity(&path);
            if now == self.watched_dirs[i] {
                continue;
            }
            if self.watched_dirs[i].take().is_some() {
                // Already dropped by the OS when the directory was deleted.
                let _ = self.watcher.unwatch(&path);
            }
            if now.is_some() {
                match self.watcher.watch(&path, RecursiveMode::Recursive) {
                    Ok(()) => {
                        tracing::info!(path = %path.display(), "watching new directory");
                        self.watched_dirs[i] = now;
                    }
                    Err(error) => {
                        tracing::warn!(path = %path.display(), %error, "cannot watch directory")
                    }
                }
            } else if let Err(error) = self.watch_parent(&path) {
                tracing::warn!(path = %path.display(), %error, "cannot watch directory");
            }
        }
    }

    /// Watch the directory holding `path`, once.
    fn watch_parent(&mut self, path: &Path) -> notify::Result<()> {
        let dir = parent_dir(path);
        if !self.watched_parents.iter().any(|d| d == dir) {
            self.watcher.watch(dir, RecursiveMode::NonRecursive)?;
            self.watched_parents.push(dir.to_path_buf());
        }
        Ok(())
    }
}

/// The Ingresses and Services of the files read (a file that does not
/// parse is already reported by the manifests' own loading).
pub(crate) fn ingress_input(reads: &[FileRead]) -> (crate::ingress_nginx::Input, Vec<ConfigError>) {
    let mut input = crate::ingress_nginx::Input::default();
    let mut messages = Vec::new();
    for read in reads {
        let Ok(text) = &read.content else { continue };
        if let Ok(docs) = crate::resources::load::read_documents(text, &read.file) {
            crate::ingress_nginx::read_documents_into(&read.file, &docs, &mut input, &mut messages);
        }
    }
    let errors = messages
        .into_iter()
        .map(|message| ConfigError {
            file: INGRESS_CONVERSION.into(),
            line: None,
            object: None,
            field: None,
            message,
        })
        .collect();
    (input, errors)
}

/// The converted objects, loaded as manifests are, the report's inexact
/// lines as configuration errors, and the whole report. Kubernetes mode
/// converts through here too (`source::kubernetes::ingresses`).
pub(crate) fn converted_ingresses(
    serving: &IngressServing,
    input: &crate::ingress_nginx::Input,
    crds: &Crds,
) -> (
    Vec<crate::resources::load::LoadedObject>,
    Vec<ConfigError>,
    crate::ingress_nginx::Report,
) {
    let options = crate::ingress_nginx::Options {
        gateway: Some(serving.gateway.clone()),
        ingress_class: serving.class.clone(),
        rollout_policy: false,
        listeners: None,
    };
    let conversion = crate::ingress_nginx::convert(input, &options);
    let docs: Vec<crate::yaml::Document> = conversion
        .objects
        .into_iter()
        .map(|value| crate::yaml::Document {
            line: 1,
            value,
            lines: crate::yaml::Lines::whole(1),
        })
        .collect();
    let parsed = crate::resources::load::load_documents(&docs, INGRESS_CONVERSION, crds);
    let mut errors: Vec<ConfigError> = parsed.errors.iter().map(ConfigError::from).collect();
    errors.extend(
        conversion
            .report
            .lines
            .iter()
            .filter(|l| l.verdict.is_inexact())
            .map(|l| ConfigError {
                file: INGRESS_CONVERSION.into(),
                line: None,
                object: Some(l.object.clone()),
                field: Some(l.annotation.clone()),
                message: l.verdict.to_string(),
            }),
    );
    (parsed.objects, errors, conversion.report)
}

/// The manifest files found under the configured paths, read.
#[derive(Debug, Default)]
pub struct Listing {
    /// Every file found, in sorted order.
    pub reads: Vec<FileRead>,
    /// Configured paths or directories that could not be listed.
    pub problems: Vec<ConfigError>,
}

/// List every manifest file under `paths` and read it. Files are named as
/// found (the configured path joined with the relative path), each once.
/// A file that vanishes between listing and reading is left out, like one
/// never listed.
pub fn read_all(paths: &[PathBuf]) -> Listing {
    let mut files = Vec::new();
    let mut problems = Vec::new();
    for path in paths {
        match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => collect_dir(path, 0, &mut files, &mut problems),
            // A file named explicitly is read whatever its extension.
            Ok(_) => files.push(path.clone()),
            Err(error) => problems.push(path_problem(path, &error)),
        }
    }
    files.sort();
    files.dedup();
    let reads = files
        .into_iter()
        .filter_map(|path| {
            let content = match std::fs::read_to_string(&path) {
                Ok(text) => Ok(text),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
                Err(error) => Err(error.to_string()),
            };
            Some(FileRead {
                file: path.display().to_string(),
                content,
            })
        })
        .collect();
    Listing { reads, problems }
}

fn path_problem(path: &Path, error: &dyn std::fmt::Display) -> ConfigError {
    ConfigError {
        file: path.display().to_string(),
        line: None,
        object: None,
        field: None,
        message: format!("cannot read: {error}"),
    }
}

fn collect_dir(
    dir: &Path,
    depth: usize,
    files: &mut Vec<PathBuf>,
    problems: &mut Vec<ConfigError>,
) {
    if depth > MAX_DEPTH {
        problems.push(path_problem(
            dir,
            &format!("directories nested deeper than {MAX_DEPTH}"),
        ));
        return;
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) => {
            problems.push(path_problem(dir, &error));
            return;
        }
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if hidden {
            continue;
        }
        // `metadata` follows symlinks: a link to a directory is walked.
        // A rollout state directory (sluice's own files) is not manifests.
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_dir() && crate::rollout::is_state_dir(&path) => {}
            Ok(meta) if meta.is_dir() => collect_dir(&path, depth + 1, files, problems),
            Ok(_) if is_manifest(&path) => files.push(path),
            Ok(_) => {}
            // A dangling symlink or a file removed while listing: skip it,
            // the next event rescans.
            Err(_) => {}
        }
    }
}

fn is_manifest(path: &Path) -> bool {
    path.extension().and_then(|e| e.to_str()).is_some_and(|e| {
        MANIFEST_EXTENSIONS
            .iter()
            .any(|m| e.eq_ignore_ascii_case(m))
    })
}

/// The CustomResourceDefinitions of `paths` (files or directories; other
/// documents are ignored), once (`serve --kubernetes --crds`), and what
/// could not be read.
pub fn read_crds(paths: &[PathBuf]) -> (Arc<Crds>, Vec<ConfigError>) {
    let mut set = FileSet::new();
    let listing = read_all(paths);
    set.update_crd_files(listing.reads);
    set.update(Vec::new());
    let mut errors = listing.problems;
    errors.extend(set.merged().1);
    (set.crds(), errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_are_read_recursively_in_sorted_order_for_manifest_extensions() {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path();
        std::fs::create_dir_all(root.join("b/nested")).expect("mkdir");
        std::fs::create_dir_all(root.join(".hidden")).expect("mkdir");
        for (name, text) in [
            ("b/nested/z.yml", "z"),
            ("a.yaml", "a"),
            ("c.json", "c"),
            ("notes.txt", "ignored"),
            (".swap.yaml", "hidden file"),
            (".hidden/x.yaml", "hidden dir"),
        ] {
            std::fs::write(root.join(name), text).expect("write");
        }
        let listing = read_all(&[root.to_path_buf()]);
        assert!(listing.problems.is_empty(), "{:?}", listing.problems);
        let reads = listing.reads;
        let names: Vec<String> = reads
            .iter()
            .map(|r| {
                Path::new(&r.file)
                    .strip_prefix(root)
                    .expect("under root")
                    .display()
                    .to_string()
            })
            .collect();
        assert_eq!(names, ["a.yaml", "b/nested/z.yml", "c.json"]);
        assert_eq!(reads[0].content, Ok("a".to_string()));
    }

    #[test]
    fn a_missing_path_is_reported_not_fatal() {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = dir.path().join("gone.yaml");
        let listing = read_all(std::slice::from_ref(&missing));
        assert!(listing.reads.is_empty());
        assert_eq!(listing.problems.len(), 1);
        assert_eq!(listing.problems[0].file, missing.display().to_string());
    }

    #[test]
    fn opening_a_file_is_not_a_change_but_writing_is() {
        assert!(!is_change(&EventKind::Access(AccessKind::Open(
            notify::event::AccessMode::Any
        ))));
        assert!(!is_change(&EventKind::Access(AccessKind::Close(
            AccessMode::Read
        ))));
        assert!(is_change(&EventKind::Access(AccessKind::Close(
            AccessMode::Write
        ))));
        assert!(is_change(&EventKind::Remove(
            notify::event::RemoveKind::File
        )));
    }

    #[test]
    fn a_close_after_writing_or_a_rename_into_place_completes_a_write() {
        use notify::event::{CreateKind, DataChange, ModifyKind, RenameMode};
        assert!(completes_write(&EventKind::Access(AccessKind::Close(
            AccessMode::Write
        ))));
        assert!(completes_write(&EventKind::Modify(ModifyKind::Name(
            RenameMode::To
        ))));
        // A file being written, created or renamed away is not done yet.
        assert!(!completes_write(&EventKind::Modify(ModifyKind::Data(
            DataChange::Any
        ))));
        assert!(!completes_write(&EventKind::Create(CreateKind::File)));
        assert!(!completes_write(&EventKind::Modify(ModifyKind::Name(
            RenameMode::From
        ))));
    }

    fn service(name: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\nspec:\n  ports:\n  - port: 80\n"
        )
    }

    fn service_names(update: &SourceUpdate) -> Vec<String> {
        update
            .snapshot
            .services
            .iter()
            .map(|s| s.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    async fn next_change(watch: &mut FileWatch) {
        let changed = tokio::time::timeout(Duration::from_secs(20), watch.changed())
            .await
            .expect("a change is reported");
        assert!(changed, "the watch is still running");
    }

    #[tokio::test]
    async fn changes_are_seen_including_rename_replace_and_removal() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut source = FileSource::new(vec![dir.path().to_path_buf()], Metrics::shared());
        let mut watch = source.watch().expect("watch the temp dir");
        let first = source.reload().expect("the first reload always reports");
        assert_eq!(first.objects, 0);

        std::fs::write(dir.path().join("a.yaml"), service("one")).expect("write");
        next_change(&mut watch).await;
        let update = source.reload().expect("a.yaml appeared");
        assert_eq!(service_names(&update), ["one"]);
        assert_eq!(
            update.snapshot.services[0].metadata.generation,
            Some(1),
            "generations are assigned"
        );

        let temp = dir.path().join(".a.yaml.swp");
        std::fs::write(&temp, service("two")).expect("write temp");
        std::fs::rename(&temp, dir.path().join("a.yaml")).expect("rename");
        next_change(&mut watch).await;
        let update = source.reload().expect("a.yaml replaced");
        assert_eq!(service_names(&update), ["two"]);

        std::fs::remove_file(dir.path().join("a.yaml")).expect("remove");
        next_change(&mut watch).await;
        let update = source.reload().expect("a.yaml removed");
        assert_eq!(update.objects, 0);
        assert!(source.reload().is_none(), "nothing changed since");
    }

    #[test]
    fn each_error_is_counted_once_while_it_lasts() {
        let dir = tempfile::tempdir().expect("temp dir");
        let metrics = Metrics::shared();
        let mut source = FileSource::new(vec![dir.path().to_path_buf()], metrics.clone());
        std::fs::write(dir.path().join("a.yaml"), "kind: [").expect("write");
        let update = source.reload().expect("first reload");
        assert_eq!(update.errors.len(), 1);
        // Another file changes: a.yaml's error is still there, not new.
        std::fs::write(dir.path().join("b.yaml"), service("b")).expect("write");
        let update = source.reload().expect("b.yaml appeared");
        assert_eq!(update.errors.len(), 1);
        let file = dir.path().join("a.yaml").display().to_string();
        let text = metrics.encode();
        assert!(
            text.contains(&format!("sluice_config_errors_total{{file=\"{file}\"}} 1")),
            "{text}"
        );
    }
}
