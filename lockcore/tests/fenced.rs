//! The reference fenced resources: which writes they apply, which they
//! refuse, and what they report about both (the model every protected
//! resource follows, so its edges are pinned exactly).

use lockcore::{FencedResource, FencedSlots, FencingToken, StaleToken};

fn token(n: u64) -> FencingToken {
    FencingToken::new(n).unwrap()
}

/// The refusal of a write with token `n` after `highest` was applied.
fn stale(n: u64, highest: u64) -> Result<(), StaleToken> {
    Err(StaleToken {
        token: token(n),
        highest: token(highest),
    })
}

#[test]
fn a_write_older_than_the_newest_applied_is_refused_and_counted() {
    let resource = FencedResource::new(0_u32);
    assert_eq!(resource.rejected(), 0);
    resource.write(token(7), |v| *v += 1).unwrap();
    // The same holder writes again under the same grant: accepted.
    resource.write(token(7), |v| *v += 1).unwrap();
    assert_eq!(resource.write(token(5), |v| *v += 100), stale(5, 7));
    resource.write(token(9), |v| *v += 1).unwrap();
    assert_eq!(
        resource.write(token(7), |v| *v += 100),
        stale(7, 9),
        "a token once newest is stale after a newer one"
    );
    assert_eq!(resource.rejected(), 2);
    assert_eq!(resource.accepted(), vec![token(7), token(7), token(9)]);
    assert_eq!(resource.read(), 3, "refused updates never ran");
}

#[test]
fn a_write_returns_what_its_update_returned() {
    let resource = FencedResource::new(vec![1, 2]);
    let len = resource
        .write(token(1), |v| {
            v.push(3);
            v.len()
        })
        .unwrap();
    assert_eq!(len, 3);
    assert_eq!(resource.read(), vec![1, 2, 3]);
}

#[test]
fn each_slot_is_fenced_on_its_own() {
    let parts = FencedSlots::new(vec![0_u32, 0]);
    assert_eq!(parts.len(), 2);
    assert!(!parts.is_empty());
    parts.write(1, token(9), |n| *n += 1).unwrap();
    assert_eq!(parts.write(1, token(3), |n| *n += 1), stale(3, 9));
    parts.write(0, token(3), |n| *n += 1).unwrap();
    assert_eq!(parts.slot(0).read(), 1);
    assert_eq!(parts.slot(1).read(), 1);
    assert_eq!(parts.slot(0).rejected(), 0);
    assert_eq!(parts.slot(1).rejected(), 1);
    assert_eq!(parts.slot(1).accepted(), vec![token(9)]);
}

#[test]
fn no_values_no_slots() {
    let none = FencedSlots::<u32>::new(Vec::new());
    assert_eq!(none.len(), 0);
    assert!(none.is_empty());
}
