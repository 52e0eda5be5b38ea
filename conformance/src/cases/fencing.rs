//! F1: fencing tokens strictly increase per name, across clients.

use crate::{CaseResult, Ctx, Outcome, ensure};

/// Twelve release/acquire cycles over three clients: every token is larger
/// than all before it, and renewals keep the token.
pub async fn fences_increase_across_cycles(cx: &Ctx) -> CaseResult {
    let clients = [cx.client().await?, cx.client().await?, cx.client().await?];
    let name = cx.name("cycles");
    let other = cx.name("cycles-other");
    let mut last = None;
    for round in 0..12 {
        let client = &clients[round % clients.len()];
        let lease = cx.must_acquire(client, &name, cx.long_ttl()).await?;
        if let Some(prev) = last {
            ensure!(
                lease.fence() > prev,
                "round {round}: fence {} is not above the previous {prev}",
                lease.fence()
            );
        }
        let renewed = client.renew(&lease).await?;
        ensure!(renewed.fence() == lease.fence(), "renew changed the fence");
        last = Some(lease.fence());
        // Activity on another name must not disturb this name's order.
        let noise = cx.must_acquire(client, &other, cx.long_ttl()).await?;
        client.release(&noise).await?;
        client.release(&renewed).await?;
    }
    Ok(Outcome::Passed)
}
