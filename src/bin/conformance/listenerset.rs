//! ListenerSet tests (`ListenerSet*`): listeners that a ListenerSet
//! attaches to a parent Gateway, their status, and routes attached to them.

use anyhow::anyhow;

use crate::check::Ctx;

/// Run the checks of test `name`.
pub async fn run(name: &str, _cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    Err(anyhow!(
        "not implemented yet: the runner has no checks for {name}, and sluice does not implement ListenerSet"
    ))
}
