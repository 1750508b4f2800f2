//! The validator on a small CRD of our own making; the upstream CRDs are
//! exercised by `tests/crd_validation.rs`.

use serde_json::{Value, json};

use super::Crds;

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  names: {kind: Widget, plural: widgets}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          apiVersion: {type: string}
          kind: {type: string}
          metadata: {type: object}
          spec:
            type: object
            required: [size]
            properties:
              size: {type: integer, minimum: 1, maximum: 10}
              ratio: {type: number, minimum: 0, exclusiveMinimum: true, maximum: 1, exclusiveMaximum: true}
              mode: {type: string, enum: [Fast, Slow], default: Slow}
              name: {type: string, maxLength: 5, pattern: '^[a-z]+$'}
              tags:
                type: array
                maxItems: 2
                items: {type: string}
                x-kubernetes-list-type: set
              ports:
                type: array
                items:
                  type: object
                  properties:
                    name: {type: string}
                    port: {type: integer}
                x-kubernetes-list-type: map
                x-kubernetes-list-map-keys: [name]
            x-kubernetes-validations:
            - rule: "self.mode == 'Fast' ? self.size > 5 : true"
              message: fast widgets are big
            - rule: "!has(self.name) || self.name != 'bad'"
              messageExpression: "'name ' + self.name + ' is taken'"
              fieldPath: .name
              reason: FieldValueForbidden
            - rule: "self == oldSelf"
              message: immutable
          status:
            type: object
            properties:
              ready: {type: boolean}
  - name: v2
    served: false
    storage: false
"#;

fn crds() -> Crds {
    let doc = crate::yaml::from_str::<Value>(CRD).expect("test CRD is YAML");
    let mut crds = Crds::new();
    crds.add(&doc, "widgets.yaml:2").expect("a usable CRD");
    crds
}

fn problems(spec: Value) -> Vec<String> {
    let mut object = json!({"apiVersion": "example.com/v1", "kind": "Widget",
                            "metadata": {"name": "w"}, "spec": spec});
    crds()
        .admit("example.com/v1", "Widget", &mut object)
        .expect("Widget is covered")
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn a_valid_object_is_defaulted_and_its_status_dropped() {
    let mut object = json!({"apiVersion": "example.com/v1", "kind": "Widget",
                            "metadata": {"name": "w"}, "spec": {"size": 3},
                            "status": {"ready": "not a bool"}});
    let errors = crds()
        .admit("example.com/v1", "Widget", &mut object)
        .unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(object["spec"]["mode"], "Slow");
    assert!(object.get("status").is_none());
    let stats = crds().stats();
    assert_eq!((stats.compiled, stats.transition), (2, 1));
    assert!(stats.failed.is_empty(), "{:?}", stats.failed);
}

#[test]
fn schema_errors_read_as_the_api_servers() {
    assert_eq!(
        problems(json!({"size": 11, "name": "Abcdef", "tags": ["a", "a", "b"], "mode": "Medium"})),
        vec![
            "spec.mode: Unsupported value: \"Medium\": supported values: \"Fast\", \"Slow\"",
            "spec.name: Too long: may not be longer than 5",
            "spec.name: Invalid value: \"Abcdef\": spec.name in body should match '^[a-z]+$'",
            "spec.size: Invalid value: 11: spec.size in body should be less than or equal to 10",
            "spec.tags: Too many: 3: must have at most 2 items",
            "spec.tags[1]: Duplicate value: \"a\"",
            "<nil>: Invalid value: \"null\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
        ]
    );
    assert_eq!(
        problems(json!({"size": 0, "ratio": 0})),
        vec![
            "spec.ratio: Invalid value: 0: spec.ratio in body should be greater than 0",
            "spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1",
        ]
    );
    assert_eq!(
        problems(json!({"size": 1, "ratio": 1})),
        vec!["spec.ratio: Invalid value: 1: spec.ratio in body should be less than 1"]
    );
    assert_eq!(
        problems(json!({"size": "big"})),
        vec![
            "spec.size: Invalid value: \"string\": spec.size in body must be of type integer: \"string\"",
            "<nil>: Invalid value: \"null\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
        ]
    );
    assert_eq!(
        problems(json!({"ports": [{"name": "a", "port": 1}, {"name": "a", "port": 2}], "size": 1})),
        vec!["spec.ports[1]: Duplicate value: map[string]interface {}{\"name\":\"a\"}"]
    );
}

#[test]
fn rules_with_messages_message_expressions_field_paths_and_reasons() {
    assert_eq!(
        problems(json!({"size": 2, "mode": "Fast"})),
        vec!["spec: Invalid value: \"object\": fast widgets are big"]
    );
    assert_eq!(
        problems(json!({"size": 2, "name": "bad"})),
        vec!["spec.name: Forbidden: name bad is taken"]
    );
}

#[test]
fn unknown_fields_missing_required_and_unserved_versions() {
    assert_eq!(
        problems(json!({"size": 2, "colour": "red"})),
        vec!["spec.colour: unknown field \"spec.colour\""]
    );
    assert_eq!(
        problems(json!({})),
        vec![
            "spec.size: Required value",
            "<nil>: Invalid value: \"null\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
        ]
    );
    let mut object =
        json!({"apiVersion": "example.com/v2", "kind": "Widget", "metadata": {"name": "w"}});
    let errors = crds()
        .admit("example.com/v2", "Widget", &mut object)
        .unwrap();
    assert_eq!(
        errors[0].body(),
        "no matches for kind \"Widget\" in version \"example.com/v2\""
    );
    assert!(
        crds()
            .admit("example.com/v1", "Gadget", &mut object)
            .is_none()
    );
}
