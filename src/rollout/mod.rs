//! Rollouts (RolloutPolicy): a route's weights say where traffic ends up,
//! a RolloutPolicy says how it gets there.
//!
//! When the weights of a governed rule change, sluice keeps `from` (the
//! shares it served just before) and `to` (the new spec shares) and serves
//! `from + p * (to - from)` at each step `p`, judging the backends whose
//! share grows by their outcomes, and going back to `from` when they fail.
//! It never writes the route's spec.
//!
//! The parts, apart so that each can be tested and replaced alone:
//! - [`shares`]: backend identities and the exact step arithmetic;
//! - [`evidence`]: the statistics, pure: anytime-valid sequential tests
//!   on counts (a mixture SPRT);
//! - [`gates`]: the [`Gate`] type and one rollout's evidence ([`Judge`]):
//!   what breaches a step, said with its counts;
//! - [`history`]: a rollout's evidence over time (counts, bounds, limits,
//!   step boundaries), bounded, for the dashboard;
//! - [`machine`]: the state machine, pure (configuration, counters and
//!   clock in; served shares, transitions and records out);
//! - [`status`]: the status shape of a rollout (`status.rollouts[]` of
//!   the policy), which is also what is persisted;
//! - [`users`]: with `consistentBy`, whose users are counted for which
//!   step, and how a step's users are shown;
//! - [`fleet`]: in Kubernetes mode, the other replicas' counts, summed
//!   with the leader's own for the machine to judge;
//! - [`sim`]: one promotion driven by the caller's counts and clock, for
//!   the simulator (`benches/rollout_sim.rs`);
//! - [`store`]: where records are kept across restarts (standalone: a
//!   file in `--state-dir`), behind the [`RolloutStore`] trait. Kubernetes
//!   mode keeps them in each policy's `status.rollouts` instead, written by
//!   the leader with the rest of the policy's status (the status writer,
//!   `crate::status`) and read back by every replica ([`recorded`]).
//!
//! - [`driver`]: what `sluice serve` does with them at each look: feeds
//!   the machine the counters (the fleet's too), logs, counts and saves
//!   its transitions, leads or follows, and says when to look again.
//!
//! The serve loop calls the driver on every configuration, at the
//! machine's deadlines and on a governed backend's 5xx or slow response
//! while a rollout is in flight, and, when the served shares change,
//! translates again (a step is a table swap like any reload). See
//! `docs/rollouts.md`.

pub mod driver;
pub mod evidence;
pub mod fleet;
pub mod gates;
pub mod history;
pub mod machine;
pub mod shares;
pub mod sim;
pub mod status;
pub mod store;
pub mod users;

pub use gates::{Bound, Confidence, Gate, GateReport, Judge, Signal, StepView, Verdict};
pub use history::History;
pub use machine::{
    Evaluation, GovernedRule, Phase, PolicyKey, Readiness, Rollout, RolloutInputs, Rollouts,
    RuleKey, ServedRule, ServedShares, StepCounts, Transition, duration_text,
};
pub use shares::{BackendKey, BackendShare, Weights};
pub use status::{RolloutReport, RolloutStatus, recorded};
pub use store::{
    FileStore, MemoryStore, RolloutStore, StateRead, configuration_of, default_state_dir,
    is_state_dir, state_dir_for,
};
