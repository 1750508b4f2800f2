//! Per-file bookkeeping of the file source, without any I/O.
//!
//! [`FileSet`] remembers, for every manifest file, the text it last read and
//! the objects of the last version that parsed. Given a fresh listing of
//! the files and their contents it decides:
//!
//! - a file whose text did not change is not parsed again;
//! - a file that no longer parses (YAML syntax, unreadable) keeps serving
//!   its last good objects, and its error is reported;
//! - an object refused by validation is dropped alone, the rest of its file
//!   is applied;
//! - a file that disappeared takes its objects with it;
//! - the same object (kind, namespace, name) in two places: the first in
//!   sorted file order (then document order) wins, the others are reported.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use serde_json::Value;

use crate::FastMap;
use crate::resources::crd::{self, Crds};
use crate::resources::{
    LoadError, LoadedObject, Object, load_documents, object_id, read_documents,
};

use super::ConfigError;
use crate::yaml::Document;

/// What reading one manifest file gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRead {
    /// The file's name as shown in errors.
    pub file: String,
    /// Its text, or why it could not be read.
    pub content: Result<String, String>,
}

#[derive(Debug, Default)]
struct FileEntry {
    /// The text last read, `None` when the last read failed.
    text: Option<String>,
    /// The CustomResourceDefinitions of the last version that parsed, with
    /// their lines.
    crds: CrdDocuments,
    /// Objects of the last version of the file that parsed.
    good: Vec<LoadedObject>,
    /// Their [`Object::spec_json`] (`specs[i]` of `good[i]`), serialized
    /// once when the file is parsed: generations compare these, and an
    /// unchanged file hands the same allocations again.
    specs: Vec<Arc<[u8]>>,
    /// Problems of the last version read.
    errors: Vec<ConfigError>,
    /// Its CRD documents that are not usable CRDs.
    crd_errors: Vec<ConfigError>,
    /// Documents of kinds sluice does not read.
    ignored: Vec<String>,
}

/// Every manifest file's last good objects and current errors, and the
/// CRDs that validate them.
#[derive(Debug, Default)]
pub struct FileSet {
    files: BTreeMap<String, FileEntry>,
    /// Files given as CRDs only (`--crds`): their other documents are not
    /// read.
    crd_files: BTreeMap<String, FileEntry>,
    /// The CRDs of `crd_files` then of `files`, and a hash of their
    /// documents to tell when they change.
    crds: Arc<Crds>,
    crds_hash: u64,
}

/// A file's CustomResourceDefinitions, with their lines.
type CrdDocuments = Vec<(usize, Value)>;

/// A file's text as documents: `(CRD documents, documents)` or why it does
/// not parse.
fn read(file: &str, text: &str) -> Result<(CrdDocuments, Vec<Document>), LoadError> {
    let documents = read_documents(text, file)?;
    let crds = documents
        .iter()
        .filter(|d| crd::is_crd(&d.value))
        .map(|d| (d.line, d.value.clone()))
        .collect();
    Ok((crds, documents))
}

fn unreadable(file: &str, message: &str) -> Vec<ConfigError> {
    vec![ConfigError {
        file: file.to_string(),
        line: None,
        object: None,
        field: None,
        message: format!("cannot read file: {message}"),
    }]
}

impl FileSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// The CRDs objects are validated with.
    pub fn crds(&self) -> Arc<Crds> {
        Arc::clone(&self.crds)
    }

    /// Bring the CRD-only files up to date (a complete listing, as for
    /// [`FileSet::update`]; call it before `update`). Returns whether they
    /// changed.
    pub fn update_crd_files(&mut self, reads: Vec<FileRead>) -> bool {
        let listed: BTreeSet<&str> = reads.iter().map(|r| r.file.as_str()).collect();
        let before = self.crd_files.len();
        self.crd_files
            .retain(|file, _| listed.contains(file.as_str()));
        let mut changed = self.crd_files.len() != before;
        for r in reads {
            let entry = self.crd_files.entry(r.file.clone()).or_default();
            match r.content {
                Ok(text) if entry.text.as_deref() == Some(text.as_str()) => {}
                Ok(text) => {
                    match read(&r.file, &text) {
                        Ok((crds, _)) => {
                            entry.crds = crds;
                            entry.errors = Vec::new();
                        }
                        Err(e) => entry.errors = vec![ConfigError::from(&e)],
                    }
                    entry.text = Some(text);
                    changed = true;
                }
                Err(message) => {
                    let errors = unreadable(&r.file, &message);
                    changed |= entry.text.is_some() || entry.errors != errors;
                    entry.text = None;
                    entry.errors = errors;
                }
            }
        }
        changed
    }

    /// Bring the set up to date with a complete listing of the files and
    /// what reading each gave. Files missing from `reads` are forgotten.
    /// When the CRDs (of `--crds` files or among the manifests) changed,
    /// every file is validated again. Returns whether anything changed
    /// since the previous call.
    pub fn update(&mut self, reads: Vec<FileRead>) -> bool {
        let listed: BTreeSet<&str> = reads.iter().map(|r| r.file.as_str()).collect();
        let before = self.files.len();
        self.files.retain(|file, _| listed.contains(file.as_str()));
        let mut changed = self.files.len() != before;

        // Read what changed; CRDs first, objects once the CRDs are known.
        let mut to_load = Vec::new();
        for read_result in reads {
            let file = read_result.file;
            let entry = self.files.entry(file.clone()).or_insert_with(|| {
                changed = true;
                FileEntry::default()
            });
            match read_result.content {
                Ok(text) => {
                    if entry.text.as_deref() == Some(text.as_str()) {
                        continue;
                    }
                    match read(&file, &text) {
                        Ok((crds, documents)) => {
                            entry.crds = crds;
                            to_load.push((file, documents));
                        }
                        // The last version that parsed goes on serving.
                        Err(e) => entry.errors = vec![ConfigError::from(&e)],
                    }
                    entry.text = Some(text);
                    changed = true;
                }
                Err(message) => {
                    let errors = unreadable(&file, &message);
                    if entry.text.is_some() || entry.errors != errors {
                        changed = true;
                    }
                    entry.text = None;
                    entry.errors = errors;
                }
            }
        }

        let crd_errors = self.refresh_crds();
        if let Some(crd_errors) = crd_errors {
            changed = true;
            // New CRDs: every file is validated again.
            to_load = self
                .files
                .iter()
                .filter_map(|(file, e)| {
                    let text = e.text.as_deref()?;
                    read(file, text).ok().map(|(_, docs)| (file.clone(), docs))
                })
                .collect();
            let mut crd_errors: BTreeMap<String, Vec<ConfigError>> =
                crd_errors.into_iter().collect();
            for (file, entry) in self.files.iter_mut().chain(self.crd_files.iter_mut()) {
                entry.crd_errors = crd_errors.remove(file).unwrap_or_default();
            }
        }
        for (file, documents) in to_load {
            let parsed = load_documents(&documents, &file, &self.crds);
            let entry = self.files.get_mut(&file).expect("files to load are listed");
            entry.errors = parsed.errors.iter().map(ConfigError::from).collect();
            entry.ignored = parsed.ignored;
            if !is_unparsable(&parsed.objects, &parsed.errors) {
                entry.specs = parsed
                    .objects
                    .iter()
                    .map(|l| l.object.spec_json().into())
                    .collect();
                entry.good = parsed.objects;
            }
        }
        changed
    }

    /// Rebuild the CRDs when their documents changed: `Some(errors per
    /// manifest file)` (CRD documents that are not usable), `None` when
    /// nothing changed.
    fn refresh_crds(&mut self) -> Option<Vec<(String, Vec<ConfigError>)>> {
        let documents: Vec<(&str, &(usize, Value))> = self
            .crd_files
            .iter()
            .chain(&self.files)
            .flat_map(|(file, e)| e.crds.iter().map(move |d| (file.as_str(), d)))
            .collect();
        let mut hasher = DefaultHasher::new();
        for (file, (line, doc)) in &documents {
            (file, line, doc.to_string()).hash(&mut hasher);
        }
        let hash = hasher.finish();
        if hash == self.crds_hash {
            return None;
        }
        let mut crds = Crds::new();
        let mut errors: BTreeMap<String, Vec<ConfigError>> = BTreeMap::new();
        for (file, (line, doc)) in documents {
            if let Err(message) = crds.add(doc, &format!("{file}:{line}")) {
                let name = doc["metadata"]["name"].as_str().unwrap_or("<unnamed>");
                errors
                    .entry(file.to_string())
                    .or_default()
                    .push(ConfigError {
                        file: file.to_string(),
                        line: Some(*line),
                        object: Some(object_id("CustomResourceDefinition", None, name)),
                        field: None,
                        message,
                    });
            }
        }
        self.crds = Arc::new(crds);
        self.crds_hash = hash;
        Some(errors.into_iter().collect())
    }

    /// The documents of kinds sluice does not read (`file:line: Kind
    /// ns/name (apiVersion)`), in file order.
    pub fn ignored(&self) -> Vec<String> {
        self.files
            .values()
            .flat_map(|e| e.ignored.iter().cloned())
            .collect()
    }

    /// The objects to serve, in file then document order, and every current
    /// problem (the CRD files' errors, each file's own errors, then the
    /// duplicates found).
    pub fn merged(&self) -> (Vec<LoadedObject>, Vec<ConfigError>) {
        let (objects, _, errors) = self.merged_with_specs();
        (objects.into_iter().cloned().collect(), errors)
    }

    /// [`FileSet::merged`], borrowed, with each object's
    /// [`Object::spec_json`] as computed when its file was parsed
    /// (`specs[i]` of `objects[i]`), for
    /// [`crate::resources::Generations::assign_with_specs`].
    pub fn merged_with_specs(&self) -> Merged<'_> {
        // Borrowed from the files: 10,000 objects are merged at every
        // reload without copying their names.
        // Hashed: a sorted map of 10,000 keys was a fifth of a reload.
        let count = self.files.values().map(|e| e.good.len()).sum();
        let mut seen: FastMap<ObjectKey<'_>, (&str, usize)> =
            FastMap::with_capacity_and_hasher(count, Default::default());
        let mut objects = Vec::with_capacity(count);
        let mut specs = Vec::with_capacity(count);
        let mut errors: Vec<ConfigError> = self
            .crd_files
            .values()
            .flat_map(|e| e.errors.iter().chain(&e.crd_errors).cloned())
            .collect();
        let mut duplicates = Vec::new();
        for entry in self.files.values() {
            errors.extend(entry.errors.iter().chain(&entry.crd_errors).cloned());
            for (loaded, spec) in entry.good.iter().zip(&entry.specs) {
                match seen.entry(ObjectKey::of(&loaded.object)) {
                    Entry::Occupied(first) => {
                        let (file, line) = first.get();
                        duplicates.push(ConfigError {
                            file: loaded.file.clone(),
                            line: Some(loaded.line),
                            object: Some(first.key().to_string()),
                            field: None,
                            message: format!(
                                "duplicate object: already defined at {file}:{line}, which is the one served"
                            ),
                        });
                        continue;
                    }
                    Entry::Vacant(slot) => {
                        slot.insert((loaded.file.as_str(), loaded.line));
                    }
                }
                objects.push(loaded);
                specs.push(spec.clone());
            }
        }
        errors.extend(duplicates);
        (objects, specs, errors)
    }
}

/// [`FileSet::merged_with_specs`]: the objects to serve (borrowed from the
/// files), their specs, and every current problem.
pub type Merged<'a> = (Vec<&'a LoadedObject>, Vec<Arc<[u8]>>, Vec<ConfigError>);

/// A file that produced errors and no object at all failed as a whole
/// (YAML syntax, not a manifest): its previous objects keep serving.
/// Objects refused by validation are reported against their object, so a
/// file whose only object was refused does not count as unparsable.
fn is_unparsable(objects: &[LoadedObject], errors: &[LoadError]) -> bool {
    objects.is_empty() && !errors.is_empty() && errors.iter().all(|e| e.object.is_none())
}

impl From<&LoadError> for ConfigError {
    fn from(error: &LoadError) -> Self {
        ConfigError {
            file: error.file.clone(),
            line: Some(error.line),
            object: error.object.clone(),
            field: error.field.clone(),
            message: error.message.clone(),
        }
    }
}

/// Identity of an object: two manifests with the same key are one object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ObjectKey<'a> {
    kind: &'static str,
    namespace: Option<&'a str>,
    name: &'a str,
}

impl<'a> ObjectKey<'a> {
    fn of(object: &'a Object) -> Self {
        ObjectKey {
            kind: object.kind(),
            namespace: object.namespace(),
            name: object.name(),
        }
    }
}

impl std::fmt::Display for ObjectKey<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&object_id(self.kind, self.namespace, self.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\nspec:\n  ports:\n  - port: 80\n"
        )
    }

    /// An HTTPRoute whose only backendRef has `weight`.
    fn route(name: &str, weight: u64) -> String {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: {name}\n\
             spec:\n  rules:\n  - backendRefs:\n    - name: s\n      port: 80\n      weight: {weight}\n"
        )
    }

    fn read(file: &str, text: &str) -> FileRead {
        FileRead {
            file: file.into(),
            content: Ok(text.into()),
        }
    }

    /// `(file, object id)` of every object served.
    fn served(set: &FileSet) -> Vec<(String, String)> {
        set.merged()
            .0
            .iter()
            .map(|l| (l.file.clone(), l.object.id()))
            .collect()
    }

    fn errors(set: &FileSet) -> Vec<ConfigError> {
        set.merged().1
    }

    fn pair(file: &str, id: &str) -> (String, String) {
        (file.to_string(), id.to_string())
    }

    #[test]
    fn a_file_that_stops_parsing_keeps_its_last_good_objects() {
        let mut set = FileSet::new();
        assert!(set.update(vec![read("a.yaml", &service("web"))]));
        assert_eq!(served(&set), [pair("a.yaml", "Service default/web")]);

        let broken = "apiVersion: v1\nkind: Service\nmetadata: [unclosed\n";
        assert!(set.update(vec![read("a.yaml", broken)]));
        assert_eq!(served(&set), [pair("a.yaml", "Service default/web")]);
        let errs = errors(&set);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].file, "a.yaml");
        assert!(errs[0].line.is_some_and(|l| l >= 3), "{errs:?}");

        // Fixed: the new version serves and the error is gone.
        assert!(set.update(vec![read("a.yaml", &service("api"))]));
        assert_eq!(served(&set), [pair("a.yaml", "Service default/api")]);
        assert!(errors(&set).is_empty());
    }

    #[test]
    fn a_file_broken_from_the_start_serves_nothing_and_reports() {
        let mut set = FileSet::new();
        set.update(vec![read("a.yaml", "kind: [")]);
        assert!(served(&set).is_empty());
        assert_eq!(errors(&set).len(), 1);
    }

    #[test]
    fn an_unreadable_file_keeps_its_last_good_objects() {
        let mut set = FileSet::new();
        set.update(vec![read("a.yaml", &service("web"))]);
        let unreadable = FileRead {
            file: "a.yaml".into(),
            content: Err("permission denied".into()),
        };
        assert!(set.update(vec![unreadable.clone()]));
        assert_eq!(served(&set), [pair("a.yaml", "Service default/web")]);
        assert!(errors(&set)[0].message.contains("permission denied"));
        // The same failure again is no change.
        assert!(!set.update(vec![unreadable]));
    }

    #[test]
    fn an_invalid_object_is_dropped_alone() {
        let mut set = FileSet::new();
        let text = format!("{}---\n{}", route("good", 1), route("bad", 1_000_001));
        set.update(vec![read("r.yaml", &text)]);
        assert_eq!(served(&set), [pair("r.yaml", "HTTPRoute default/good")]);
        let errs = errors(&set);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].object.as_deref(), Some("HTTPRoute default/bad"));
        assert!(
            errs[0]
                .field
                .as_deref()
                .is_some_and(|f| f.ends_with("weight")),
            "{errs:?}"
        );
    }

    #[test]
    fn an_object_that_becomes_invalid_is_removed_not_kept() {
        // Validation refuses the object; it does not make the file
        // unparsable, so the object's previous version is not kept.
        let mut set = FileSet::new();
        set.update(vec![read("r.yaml", &route("web", 1))]);
        set.update(vec![read("r.yaml", &route("web", 2_000_000))]);
        assert!(served(&set).is_empty());
        assert_eq!(errors(&set).len(), 1);
    }

    #[test]
    fn a_file_that_disappears_takes_its_objects_with_it() {
        let mut set = FileSet::new();
        set.update(vec![
            read("a.yaml", &service("a")),
            read("b.yaml", &service("b")),
        ]);
        assert!(set.update(vec![read("b.yaml", &service("b"))]));
        assert_eq!(served(&set), [pair("b.yaml", "Service default/b")]);
    }

    #[test]
    fn the_same_listing_again_is_no_change() {
        let mut set = FileSet::new();
        assert!(set.update(vec![read("a.yaml", &service("a"))]));
        assert!(!set.update(vec![read("a.yaml", &service("a"))]));
        assert!(set.update(vec![read("a.yaml", &service("b"))]));
        assert!(set.update(vec![]));
        assert!(!set.update(vec![]));
    }

    #[test]
    fn duplicates_are_served_from_the_first_file_in_sorted_order() {
        let mut set = FileSet::new();
        // Listing order does not matter: files are kept sorted.
        set.update(vec![
            read("b.yaml", &service("web")),
            read(
                "a.yaml",
                &format!("{}---\n{}", service("web"), service("web")),
            ),
        ]);
        assert_eq!(served(&set), [pair("a.yaml", "Service default/web")]);
        let errs = errors(&set);
        let places: Vec<(&str, Option<usize>)> =
            errs.iter().map(|e| (e.file.as_str(), e.line)).collect();
        assert_eq!(places, [("a.yaml", Some(9)), ("b.yaml", Some(1))]);
        assert!(
            errs.iter().all(|e| e.message.contains("a.yaml:1")),
            "{errs:?}"
        );
        assert!(
            errs.iter()
                .all(|e| e.object.as_deref() == Some("Service default/web"))
        );
    }

    #[test]
    fn same_name_in_different_namespaces_or_kinds_is_not_a_duplicate() {
        let mut set = FileSet::new();
        let other_ns = service("web").replace("name: web", "name: web\n  namespace: shop");
        set.update(vec![read(
            "a.yaml",
            &format!(
                "{}---\n{}---\n{}",
                service("web"),
                other_ns,
                route("web", 1)
            ),
        )]);
        assert_eq!(served(&set).len(), 3);
        assert!(errors(&set).is_empty());
    }
}
