//! Runs the election example: a leader frozen past its lease is replaced by
//! one with a larger term, and its late write under the old term is refused.

#[path = "../examples/election.rs"]
#[allow(dead_code)]
mod example;

use std::time::Duration;

use distlock::LossReason;
use lock_conformance::kit::scaled;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_frozen_leaders_write_is_refused() {
    let started = std::time::Instant::now();
    let story = example::run().await.expect("the story holds");
    assert!(
        started.elapsed() < scaled(Duration::from_secs(5)),
        "{:?}",
        started.elapsed()
    );

    assert!(story.successor_term > story.frozen_term, "{story:?}");
    assert!(story.last_term > story.successor_term, "{story:?}");
    assert_eq!(story.refusal.token, story.frozen_term);
    assert_eq!(story.refusal.highest, story.successor_term);
    assert!(
        matches!(
            story.frozen_loss,
            LossReason::DeadlinePassed | LossReason::RenewalRefused
        ),
        "{:?}",
        story.frozen_loss
    );
    let mut candidates = [story.successor.as_str(), story.last.as_str()];
    candidates.sort_unstable();
    assert_eq!(candidates, ["node-b", "node-c"]);

    // The narrative tells it in order: the freeze, the new leader seen by
    // the observer, the refusal, the new leader's write.
    let position = |needle: &str| {
        story
            .narrative
            .iter()
            .position(|line| line.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?}:\n{}", story.narrative.join("\n")))
    };
    let froze = position("FREEZES");
    let observed = position(&format!(
        "leader: {}, term {}",
        story.successor, story.successor_term
    ));
    let refused = position("REFUSED: stale fencing token");
    let applied = position(&format!(
        "writes the schedule (term {}): applied",
        story.successor_term
    ));
    assert!(
        froze < observed && observed < refused && refused < applied,
        "{}",
        story.narrative.join("\n")
    );
}
