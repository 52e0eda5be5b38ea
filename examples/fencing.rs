//! The last units of stock, four workers, and one worker that freezes.
//!
//! Run it with `cargo run --example fencing` (no server needed: it uses the
//! in-memory backend). A worker takes the lock, reads the stock, and then is
//! paused longer than its lease (think of a GC pause or a stopped VM). The
//! store frees the lock, the other workers sell the remaining units, and
//! when the paused worker wakes up it writes its stale view back. The stock
//! checks fencing tokens, so that late write is refused; a plain counter next
//! to it, which does not, is corrupted.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{FencedResource, LockError, Locker, MemoryBackend};
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_millis(400);
const PAUSE: Duration = Duration::from_millis(1300);
const UNITS: u32 = 3;

/// The shop's data: stock guarded by fencing, and an unguarded copy that
/// shows what would happen without it.
struct Shop {
    stock: FencedResource<u32>,
    unfenced: Mutex<u32>,
    started: Instant,
}

impl Shop {
    fn log(&self, who: &str, what: impl AsRef<str>) {
        println!(
            "  +{:>5.3}s  {who:<8} {}",
            self.started.elapsed().as_secs_f64(),
            what.as_ref()
        );
    }

    /// Sells one unit under `fence` from a stock level read earlier.
    fn sell(&self, who: &str, fence: distlock::FencingToken, seen: u32) -> bool {
        *self.unfenced.lock().unwrap() = seen - 1;
        match self.stock.write(fence, |units| *units = seen - 1) {
            Ok(()) => {
                self.log(
                    who,
                    format!("sold 1 unit  (fence {fence}) -> stock {}", seen - 1),
                );
                true
            }
            Err(stale) => {
                self.log(who, format!("write REFUSED: {stale}"));
                false
            }
        }
    }
}

async fn worker(who: &'static str, locker: Locker, shop: Arc<Shop>) -> Result<bool, LockError> {
    let guard = locker.acquire("sku-42").await?;
    let fence = guard.fencing_token();
    let seen = shop.stock.read();
    shop.log(
        who,
        format!("acquired     (fence {fence}), reads stock = {seen}"),
    );
    if seen == 0 {
        shop.log(who, "sold out, nothing to do");
        guard.release().await?;
        return Ok(false);
    }
    sleep(Duration::from_millis(30)).await; // pick, pack, charge the card...
    let sold = guard.is_held() && shop.sell(who, fence, seen);
    guard.release().await?;
    Ok(sold)
}

async fn zombie(locker: Locker, shop: Arc<Shop>) -> Result<bool, LockError> {
    let who = "zombie";
    let guard = locker.acquire("sku-42").await?;
    let fence = guard.fencing_token();
    let seen = shop.stock.read();
    shop.log(
        who,
        format!("acquired     (fence {fence}), reads stock = {seen}"),
    );
    // It checks that it still holds the lock... then freezes before writing.
    assert!(guard.is_held());
    shop.log(
        who,
        format!("checked is_held() = true, then FREEZES for {PAUSE:?} (TTL is {TTL:?})"),
    );
    let lost = guard.lost_token();
    let shop2 = shop.clone();
    tokio::spawn(async move {
        lost.cancelled().await;
        shop2.log(
            who,
            "(its guard marks the lease lost; the frozen worker cannot see it)",
        );
    });
    sleep(PAUSE).await;
    shop.log(
        who,
        format!(
            "wakes up and writes its stale view: stock {seen} -> {}",
            seen - 1
        ),
    );
    let sold = shop.sell(who, fence, seen);
    drop(guard);
    Ok(sold)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = MemoryBackend::new();
    let shop = Arc::new(Shop {
        stock: FencedResource::new(UNITS),
        unfenced: Mutex::new(UNITS),
        started: Instant::now(),
    });
    println!("distlock fencing demo: {UNITS} units left of sku-42, 4 workers, lease TTL {TTL:?}\n");

    // The zombie's renewals stop while it is frozen, like every thread of a
    // paused process; its lease runs out on the store's clock.
    let frozen = Locker::new(store.clone()).ttl(TTL).auto_renew(false);
    let zombie = tokio::spawn(zombie(frozen, shop.clone()));
    sleep(Duration::from_millis(50)).await;

    let mut workers = Vec::new();
    for who in ["worker-1", "worker-2", "worker-3"] {
        let locker = Locker::new(store.clone())
            .ttl(TTL)
            .max_wait(Duration::from_secs(10));
        workers.push(tokio::spawn(worker(who, locker, shop.clone())));
        sleep(Duration::from_millis(5)).await;
    }
    let mut sold = 0;
    for w in workers {
        sold += u32::from(w.await??);
    }
    let zombie_sold = zombie.await??;
    sold += u32::from(zombie_sold);

    let stock = shop.stock.read();
    let unfenced = *shop.unfenced.lock().unwrap();
    println!();
    println!(
        "  fenced stock   : {stock} units left, {sold} sold, {} late write(s) refused",
        shop.stock.rejected()
    );
    println!("  unfenced copy  : {unfenced} units left (it took the zombie's stale write)");
    println!();
    if stock + sold == UNITS && !zombie_sold && unfenced != stock {
        let newest = shop.stock.accepted().last().copied().map_or(0, |f| f.get());
        println!(
            "VERDICT: safe. The frozen worker's late write carried an older fencing token than {newest},"
        );
        println!(
            "         the newest the stock had applied, so it was refused. Without fencing, {unfenced} units"
        );
        println!("         would be on sale that do not exist.");
        Ok(())
    } else {
        Err(format!("VERDICT: UNSAFE: stock {stock}, sold {sold}, unfenced {unfenced}").into())
    }
}
