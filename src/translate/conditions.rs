//! Building status conditions: every condition carries the generation it
//! was computed from (`observedGeneration`) and the translation time.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Makes conditions for one object.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConditionMaker {
    pub generation: i64,
    pub now: Timestamp,
}

impl ConditionMaker {
    pub fn make(
        &self,
        type_: &str,
        status: bool,
        reason: &str,
        message: impl Into<String>,
    ) -> Condition {
        Condition {
            type_: type_.to_string(),
            status: if status { "True" } else { "False" }.to_string(),
            reason: reason.to_string(),
            message: message.into(),
            observed_generation: Some(self.generation),
            last_transition_time: Time(self.now),
        }
    }
}

/// Replace the condition of the same type (keeping its transition time
/// when the status does not change), or append it.
pub(crate) fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition) {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(old) => {
            if old.status == new.status {
                new.last_transition_time = old.last_transition_time.clone();
            }
            *old = new;
        }
        None => conditions.push(new),
    }
}
