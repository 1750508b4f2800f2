//! `metadata.generation` and `metadata.creationTimestamp` without an API
//! server.
//!
//! DESIGN.md: an object's generation is the file's value when it gives one;
//! otherwise 1 when first seen and +1 each time its `spec` changes (not its
//! status or labels). Its creationTimestamp is the file's value, otherwise
//! the time sluice first saw it, kept across reloads. Pure: the caller
//! passes the clock.
//!
//! Comparing specs serializes them; the file source serializes each object
//! once, when its file is parsed, and hands the bytes in
//! ([`Generations::assign_with_specs`]): an object of an unchanged file is
//! then the same allocation as last time, one pointer compare.
//!
//! HTTPRoutes are shared ([`Object::HttpRoute`] holds an `Arc`): filling
//! in their metadata would copy each of them at every reload. The copy
//! made last time is kept with what it was made from; an object that is
//! the same allocation again and gets the same generation and time is
//! given that copy, so that a reload that changed one file copies only
//! that file's routes (and the snapshot shares the others with the last
//! one).
//!
//! What is remembered is updated in place: an object seen before is found
//! by a key written into one reused buffer, so that a reload of 10,000
//! unchanged objects allocates no key (a new map of owned keys at every
//! reload was a quarter of a 10,000-route flip's reading).

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::{HttpRoute, Object};
use crate::FastMap;

/// What sluice remembers of every object it has seen, across reloads.
#[derive(Debug, Clone, Default)]
pub struct Generations {
    /// By [`write_key`].
    seen: FastMap<String, Seen>,
    /// Counts calls to [`Generations::assign_with_specs`]: an entry not
    /// marked with the current one was not in the last set, and goes.
    round: u64,
}

/// Write the key of the object (kind, namespace or "", name) into `key`.
/// NUL cannot occur in any of the three, so keys do not collide.
fn write_key(key: &mut String, object: &Object) {
    key.clear();
    key.push_str(object.kind());
    key.push('\0');
    key.push_str(object.namespace().unwrap_or(""));
    key.push('\0');
    key.push_str(object.name());
}

#[derive(Debug, Clone)]
struct Seen {
    /// The [`Generations::round`] that last saw the object.
    round: u64,
    /// [`Object::spec_json`].
    spec: Arc<[u8]>,
    generation: i64,
    created: Timestamp,
    /// An HTTPRoute: the object as given, and the copy with this
    /// generation and time filled in, handed out again while both hold.
    route: Option<(Arc<HttpRoute>, Arc<HttpRoute>)>,
}

impl Generations {
    pub fn new() -> Self {
        Self::default()
    }

    /// Fill in `metadata.generation` and `metadata.creationTimestamp` of
    /// `objects` (the complete current set), and forget objects that are no
    /// longer present.
    pub fn assign(&mut self, objects: &mut [Object], now: Timestamp) {
        let specs: Vec<Arc<[u8]>> = objects.iter().map(|o| o.spec_json().into()).collect();
        self.assign_with_specs(objects, &specs, now);
    }

    /// [`Generations::assign`] with each object's [`Object::spec_json`]
    /// given (`specs[i]` of `objects[i]`), already computed: bytes that are
    /// the allocation seen last time compare by pointer.
    pub fn assign_with_specs(
        &mut self,
        objects: &mut [Object],
        specs: &[Arc<[u8]>],
        now: Timestamp,
    ) {
        assert_eq!(objects.len(), specs.len(), "one spec per object");
        self.round += 1;
        let round = self.round;
        let mut key = String::new();
        for (object, spec) in objects.iter_mut().zip(specs) {
            write_key(&mut key, object);
            let prev = self.seen.get(key.as_str()).filter(|p| p.round < round);
            let same_spec = |p: &Seen| Arc::ptr_eq(&p.spec, spec) || p.spec == *spec;
            let meta = object.metadata();
            let generation = match (meta.generation, prev) {
                (Some(g), _) => g,
                (None, None) => 1,
                (None, Some(p)) if same_spec(p) => p.generation,
                (None, Some(p)) => p.generation.saturating_add(1),
            };
            let created = match (&meta.creation_timestamp, prev) {
                (Some(t), _) => t.0,
                (None, Some(p)) => p.created,
                (None, None) => now,
            };
            let given = match &*object {
                Object::HttpRoute(r) => Some(r.clone()),
                _ => None,
            };
            let filled = |r: &HttpRoute| {
                r.metadata.generation == Some(generation)
                    && r.metadata.creation_timestamp.as_ref().map(|t| t.0) == Some(created)
            };
            let again = match (&given, prev.and_then(|p| p.route.as_ref())) {
                (Some(given), Some((was, copy))) if Arc::ptr_eq(given, was) && filled(copy) => {
                    Some(copy.clone())
                }
                _ => None,
            };
            match again {
                Some(copy) => *object = Object::HttpRoute(copy),
                None => {
                    // Written only where it differs: a shared route is
                    // copied by the write.
                    let meta = object.metadata();
                    if meta.generation != Some(generation)
                        || meta.creation_timestamp.as_ref().map(|t| t.0) != Some(created)
                    {
                        let meta = object.metadata_mut();
                        meta.generation = Some(generation);
                        meta.creation_timestamp = Some(Time(created));
                    }
                }
            }
            let route = match (given, &*object) {
                (Some(given), Object::HttpRoute(copy)) => Some((given, copy.clone())),
                _ => None,
            };
            let seen = Seen {
                round,
                spec: spec.clone(),
                generation,
                created,
                route,
            };
            match self.seen.get_mut(key.as_str()) {
                Some(entry) => *entry = seen,
                None => {
                    self.seen.insert(key.clone(), seen);
                }
            }
        }
        // Forget what this set no longer has.
        self.seen.retain(|_, seen| seen.round == round);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::parse_manifests;

    fn route(yaml_extra: &str, hostname: &str) -> Object {
        let text = format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
             metadata:\n  name: r\n{yaml_extra}spec:\n  hostnames: [{hostname}]\n"
        );
        let mut parsed = parse_manifests(&text, "t.yaml");
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        parsed.objects.remove(0).object
    }

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("small timestamps are valid")
    }

    fn meta(o: &Object) -> (Option<i64>, Option<Timestamp>) {
        let m = o.metadata();
        (m.generation, m.creation_timestamp.as_ref().map(|t| t.0))
    }

    #[test]
    fn counts_spec_changes_from_one() {
        let mut g = Generations::new();
        let mut objs = [route("", "a.example.com")];
        g.assign(&mut objs, ts(100));
        assert_eq!(meta(&objs[0]), (Some(1), Some(ts(100))));

        // Same spec, later reload: unchanged, creation time kept.
        let mut objs = [route("", "a.example.com")];
        g.assign(&mut objs, ts(200));
        assert_eq!(meta(&objs[0]), (Some(1), Some(ts(100))));

        // Spec change: +1.
        let mut objs = [route("", "b.example.com")];
        g.assign(&mut objs, ts(300));
        assert_eq!(meta(&objs[0]), (Some(2), Some(ts(100))));
    }

    fn shared(o: &Object) -> Arc<HttpRoute> {
        match o {
            Object::HttpRoute(r) => r.clone(),
            other => panic!("an HTTPRoute: {other:?}"),
        }
    }

    #[test]
    fn a_route_given_again_gets_last_reloads_copy_and_a_changed_one_its_own() {
        let mut g = Generations::new();
        // The object as an unchanged file holds it, handed at each reload.
        let given = route("", "a.example.com");
        let mut objs = [given.clone()];
        g.assign(&mut objs, ts(100));
        let first = shared(&objs[0]);
        assert!(!Arc::ptr_eq(&first, &shared(&given)), "filled in on a copy");
        assert_eq!(
            shared(&given).metadata.generation,
            None,
            "the given one is not written"
        );

        let mut objs = [given.clone()];
        g.assign(&mut objs, ts(200));
        assert!(
            Arc::ptr_eq(&first, &shared(&objs[0])),
            "last reload's copy again"
        );
        assert_eq!(meta(&objs[0]), (Some(1), Some(ts(100))));

        // Parsed again (its file changed), equal spec: its own copy, the
        // same generation and time.
        let mut objs = [route("", "a.example.com")];
        g.assign(&mut objs, ts(300));
        assert!(!Arc::ptr_eq(&first, &shared(&objs[0])));
        assert_eq!(meta(&objs[0]), (Some(1), Some(ts(100))));

        // The old allocation given again after that: its spec is the same,
        // so the generation too, and the copy kept is the newer one's.
        let mut objs = [given.clone()];
        g.assign(&mut objs, ts(400));
        assert_eq!(meta(&objs[0]), (Some(1), Some(ts(100))));

        // A changed spec: generation 2, whatever was kept.
        let mut objs = [route("", "b.example.com")];
        g.assign(&mut objs, ts(500));
        assert_eq!(meta(&objs[0]), (Some(2), Some(ts(100))));
        let mut objs = [given.clone()];
        g.assign(&mut objs, ts(600));
        assert_eq!(meta(&objs[0]), (Some(3), Some(ts(100))), "changed back: +1");
    }

    #[test]
    fn an_object_gone_and_back_starts_again() {
        let mut g = Generations::new();
        let mut objs = [route("", "a.example.com")];
        g.assign(&mut objs, ts(100));
        let mut objs = [route("", "b.example.com")];
        g.assign(&mut objs, ts(200));
        assert_eq!(meta(&objs[0]), (Some(2), Some(ts(100))));
        // A reload without it forgets it ...
        g.assign(&mut [], ts(300));
        // ... so that it is new when it comes back.
        let mut objs = [route("", "b.example.com")];
        g.assign(&mut objs, ts(400));
        assert_eq!(meta(&objs[0]), (Some(1), Some(ts(400))));
    }

    #[test]
    fn objects_of_other_kinds_or_namespaces_with_the_same_name_are_apart() {
        let mut g = Generations::new();
        let text = "apiVersion: v1\nkind: Service\nmetadata: {name: r}\nspec: {ports: [{port: 80}]}\n---\n\
                    apiVersion: v1\nkind: Service\nmetadata: {name: r, namespace: other}\nspec: {ports: [{port: 81}]}\n";
        let mut objs: Vec<Object> = crate::resources::parse_manifests(text, "t.yaml")
            .objects
            .into_iter()
            .map(|l| l.object)
            .chain([route("", "a.example.com")])
            .collect();
        g.assign(&mut objs, ts(100));
        // The route's spec changes; the Services' do not.
        objs[2] = route("", "b.example.com");
        for o in &mut objs[..2] {
            o.metadata_mut().generation = None;
        }
        g.assign(&mut objs, ts(200));
        let generations: Vec<Option<i64>> = objs.iter().map(|o| meta(o).0).collect();
        assert_eq!(generations, [Some(1), Some(1), Some(2)]);
    }

    #[test]
    fn labels_do_not_bump_the_generation() {
        let mut g = Generations::new();
        let mut objs = [route("", "a.example.com")];
        g.assign(&mut objs, ts(1));
        let mut objs = [route("  labels: {team: x}\n", "a.example.com")];
        g.assign(&mut objs, ts(2));
        assert_eq!(meta(&objs[0]).0, Some(1));
    }

    #[test]
    fn values_from_the_file_win() {
        let mut g = Generations::new();
        let mut objs = [route(
            "  generation: 7\n  creationTimestamp: \"2024-01-02T03:04:05Z\"\n",
            "a.example.com",
        )];
        g.assign(&mut objs, ts(1));
        let expected: Timestamp = "2024-01-02T03:04:05Z".parse().expect("valid timestamp");
        assert_eq!(meta(&objs[0]), (Some(7), Some(expected)));
        // The file drops its generation: counting continues from 7.
        let mut objs = [route("", "b.example.com")];
        g.assign(&mut objs, ts(2));
        assert_eq!(meta(&objs[0]), (Some(8), Some(expected)));
    }

    #[test]
    fn forgets_objects_that_disappear() {
        let mut g = Generations::new();
        let mut objs = [route("", "a.example.com")];
        g.assign(&mut objs, ts(1));
        let mut objs = [route("", "b.example.com")];
        g.assign(&mut objs, ts(2));
        assert_eq!(meta(&objs[0]).0, Some(2));
        g.assign(&mut [], ts(3));
        // Seen again: a new object, generation 1, created now.
        let mut objs = [route("", "b.example.com")];
        g.assign(&mut objs, ts(4));
        assert_eq!(meta(&objs[0]), (Some(1), Some(ts(4))));
    }
}
