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

use std::collections::{BTreeMap, BTreeSet};

use crate::resources::{LoadError, LoadedObject, Object, object_id, parse_manifests};

use super::ConfigError;

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
    /// Objects of the last version of the file that parsed.
    good: Vec<LoadedObject>,
    /// Problems of the last version read.
    errors: Vec<ConfigError>,
}

/// Every manifest file's last good objects and current errors.
#[derive(Debug, Default)]
pub struct FileSet {
    files: BTreeMap<String, FileEntry>,
}

impl FileSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bring the set up to date with a complete listing of the files and
    /// what reading each gave. Files missing from `reads` are forgotten.
    /// Returns whether anything changed since the previous call.
    pub fn update(&mut self, reads: Vec<FileRead>) -> bool {
        let listed: BTreeSet<&str> = reads.iter().map(|r| r.file.as_str()).collect();
        let before = self.files.len();
        self.files.retain(|file, _| listed.contains(file.as_str()));
        let mut changed = self.files.len() != before;

        for read in reads {
            let entry = self.files.entry(read.file.clone()).or_insert_with(|| {
                changed = true;
                FileEntry::default()
            });
            match read.content {
                Ok(text) => {
                    if entry.text.as_deref() == Some(text.as_str()) {
                        continue;
                    }
                    let parsed = parse_manifests(&text, &read.file);
                    let errors: Vec<ConfigError> =
                        parsed.errors.iter().map(ConfigError::from).collect();
                    if is_unparsable(&parsed.objects, &parsed.errors) {
                        // Keep `entry.good`: the last version that parsed
                        // goes on serving.
                    } else {
                        entry.good = parsed.objects;
                    }
                    entry.errors = errors;
                    entry.text = Some(text);
                    changed = true;
                }
                Err(message) => {
                    let errors = vec![ConfigError {
                        file: read.file.clone(),
                        line: None,
                        object: None,
                        field: None,
                        message: format!("cannot read file: {message}"),
                    }];
                    if entry.text.is_some() || entry.errors != errors {
                        changed = true;
                    }
                    entry.text = None;
                    entry.errors = errors;
                }
            }
        }
        changed
    }

    /// The objects to serve, in file then document order, and every current
    /// problem (each file's own errors followed by the duplicates found).
    pub fn merged(&self) -> (Vec<LoadedObject>, Vec<ConfigError>) {
        let mut seen: BTreeMap<ObjectKey, (String, usize)> = BTreeMap::new();
        let mut objects = Vec::new();
        let mut errors = Vec::new();
        let mut duplicates = Vec::new();
        for entry in self.files.values() {
            errors.extend(entry.errors.iter().cloned());
            for loaded in &entry.good {
                let key = ObjectKey::of(&loaded.object);
                if let Some((file, line)) = seen.get(&key) {
                    duplicates.push(ConfigError {
                        file: loaded.file.clone(),
                        line: Some(loaded.line),
                        object: Some(key.to_string()),
                        field: None,
                        message: format!(
                            "duplicate object: already defined at {file}:{line}, which is the one served"
                        ),
                    });
                    continue;
                }
                seen.insert(key, (loaded.file.clone(), loaded.line));
                objects.push(loaded.clone());
            }
        }
        errors.extend(duplicates);
        (objects, errors)
    }
}

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
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct ObjectKey {
    kind: &'static str,
    namespace: Option<String>,
    name: String,
}

impl ObjectKey {
    fn of(object: &Object) -> Self {
        ObjectKey {
            kind: object.kind(),
            namespace: object.namespace().map(str::to_string),
            name: object.name().to_string(),
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&object_id(self.kind, self.namespace.as_deref(), &self.name))
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
