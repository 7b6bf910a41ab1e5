//! The queue's rules: table tests and property tests over random op sequences.

use proptest::prelude::*;

use super::*;

fn op(number: u64, version: u64, action: QueueAction) -> QueueOp {
    QueueOp {
        branch: "main".into(),
        number,
        version,
        action,
    }
}

fn join(number: u64, version: u64) -> QueueOp {
    op(
        number,
        version,
        QueueAction::Join {
            priority: Priority::Normal,
        },
    )
}

fn numbers(q: &BranchQueue) -> Vec<u64> {
    q.order().iter().map(|e| e.number).collect()
}

#[test]
fn the_first_entry_becomes_the_head_and_keeps_it() {
    let mut q = BranchQueue::new("main");
    assert!(q.apply(&join(1, 1), 10));
    assert!(q.apply(&join(2, 1), 20));
    assert_eq!(q.head, Some(1));
    // A high-priority entry goes before every normal one, never before the head.
    let high = op(
        3,
        1,
        QueueAction::Join {
            priority: Priority::High,
        },
    );
    assert!(q.apply(&high, 30));
    assert_eq!(numbers(&q), vec![1, 3, 2]);
    let places = q.places();
    assert!(places[&1].head);
    assert_eq!(places[&3].position, Some(2));
    assert_eq!(places[&2].position, Some(3));
}

#[test]
fn a_parked_pr_re_enters_at_its_old_position() {
    let mut q = BranchQueue::new("main");
    for n in 1..=3 {
        q.apply(&join(n, 1), 0);
    }
    let park = op(
        1,
        2,
        QueueAction::Park {
            reason: Ejection::CiFailed,
        },
    );
    assert!(q.apply(&park, 5));
    assert_eq!(q.head, Some(2));
    assert_eq!(q.parked().len(), 1);
    assert_eq!(q.stats.ejections[&Ejection::CiFailed], 1);
    // Green again: back in, before 3 (its ticket is older); 2 keeps the head.
    assert!(q.apply(&join(1, 3), 9));
    assert_eq!(numbers(&q), vec![2, 1, 3]);
    // Requeue: a new ticket, behind 3.
    let back = op(
        1,
        4,
        QueueAction::Requeue {
            reason: Ejection::BaseMoving,
        },
    );
    assert!(q.apply(&back, 10));
    assert!(q.apply(&join(1, 5), 11));
    assert_eq!(numbers(&q), vec![2, 3, 1]);
}

#[test]
fn stale_and_duplicate_ops_change_nothing() {
    let mut q = BranchQueue::new("main");
    q.apply(&join(1, 3), 0);
    let leave = op(
        1,
        4,
        QueueAction::Leave {
            reason: Departure::Merged,
        },
    );
    assert!(q.apply(&leave, 100));
    assert_eq!(q.stats.merged, 1);
    assert_eq!(q.stats.merged_wait_ms, 100);
    // The same op again, or an older join redelivered late: nothing.
    assert!(!q.apply(&leave, 101));
    assert!(!q.apply(&join(1, 3), 102));
    assert!(q.entries.is_empty());
    // Another branch's op: nothing.
    let mut other = join(5, 1);
    other.branch = "dev".into();
    assert!(!q.apply(&other, 0));
}

#[test]
fn only_moved_prs_are_told() {
    let mut q = BranchQueue::new("main");
    q.apply(&join(1, 1), 0);
    q.apply(&join(2, 1), 0);
    let before = q.clone();
    q.apply(&join(3, 1), 0);
    q.version += 1;
    let told: Vec<u64> = changed_places(&before, &q)
        .iter()
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(told, vec![3]);
    let before = q.clone();
    q.apply(
        &op(
            1,
            2,
            QueueAction::Leave {
                reason: Departure::Merged,
            },
        ),
        0,
    );
    q.version += 1;
    let told = changed_places(&before, &q);
    let who: Vec<u64> = told.iter().map(|(n, _)| *n).collect();
    assert_eq!(who, vec![1, 2, 3]);
    assert_eq!(told[0].1.position, None);
    assert!(told[1].1.head);
    assert_eq!(told[2].1.position, Some(2));
}

fn sha(c: char) -> Sha {
    c.to_string().repeat(8).parse().unwrap()
}

#[test]
fn the_head_is_updated_only_when_not_on_the_tip() {
    let reading = |merge_base: Option<char>, head: char| HeadReading {
        merged: false,
        open: true,
        head: sha(head),
        pinned: sha('a'),
        merge_base: merge_base.map(sha),
        tip: sha('f'),
    };
    assert_eq!(
        head_action(&reading(Some('f'), 'a')),
        HeadAction::Merge { tip: sha('f') }
    );
    assert_eq!(
        head_action(&reading(Some('e'), 'a')),
        HeadAction::Update { tip: sha('f') }
    );
    assert_eq!(head_action(&reading(Some('f'), 'b')), HeadAction::HeadMoved);
    let mut merged = reading(Some('e'), 'b');
    merged.merged = true;
    assert_eq!(head_action(&merged), HeadAction::Merged);
}

/// A random op on one of five PRs.
fn arb_action() -> impl Strategy<Value = QueueAction> {
    prop_oneof![
        3 => prop_oneof![Just(Priority::High), Just(Priority::Normal)]
            .prop_map(|priority| QueueAction::Join { priority }),
        1 => prop_oneof![Just(Ejection::CiFailed), Just(Ejection::CiTimeout)]
            .prop_map(|reason| QueueAction::Park { reason }),
        1 => Just(QueueAction::Requeue { reason: Ejection::BaseMoving }),
        1 => prop_oneof![
            Just(Departure::Merged),
            Just(Departure::Closed),
            Just(Departure::Dequeued),
            Just(Departure::Retargeted)
        ]
        .prop_map(|reason| QueueAction::Leave { reason }),
    ]
}

/// Ops with increasing versions per PR (as records send them).
fn arb_ops() -> impl Strategy<Value = Vec<QueueOp>> {
    prop::collection::vec((1u64..=5, arb_action()), 0..40).prop_map(|raw| {
        let mut versions = BTreeMap::new();
        raw.into_iter()
            .map(|(n, action)| {
                let v = versions.entry(n).or_insert(0u64);
                *v += 1;
                op(n, *v, action)
            })
            .collect()
    })
}

/// The PRs being tested or waiting, with their priority (what must converge).
fn active(q: &BranchQueue) -> Vec<(u64, Priority)> {
    let mut v: Vec<(u64, Priority)> = q.order().iter().map(|e| (e.number, e.priority)).collect();
    v.sort();
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// At most one head, always an active entry, and there is one whenever any entry
    /// waits; a head stays the head while it is active.
    #[test]
    fn one_head_that_is_never_overtaken(ops in arb_ops()) {
        let mut q = BranchQueue::new("main");
        for (t, o) in ops.iter().enumerate() {
            let before = q.head;
            q.apply(o, t as i64);
            let active: Vec<u64> = q.order().iter().map(|e| e.number).collect();
            match q.head {
                Some(h) => {
                    prop_assert_eq!(active.first(), Some(&h));
                    prop_assert_eq!(q.entries.iter().filter(|e| e.number == h).count(), 1);
                }
                None => prop_assert!(active.is_empty()),
            }
            if let Some(b) = before && active.contains(&b) {
                prop_assert_eq!(q.head, Some(b));
            }
            let heads = q.places().values().filter(|p| p.head).count();
            prop_assert!(heads <= 1);
        }
    }

    /// Redelivered and reordered ops converge: applying every op, duplicates and all,
    /// in any order tests the same PRs with the same priorities as the ordered run
    /// (the latest op of each PR decides).
    #[test]
    fn reordered_and_duplicated_ops_converge(
        ops in arb_ops(),
        seed in any::<u64>(),
    ) {
        let mut ordered = BranchQueue::new("main");
        for o in &ops {
            ordered.apply(o, 0);
        }
        let mut shuffled: Vec<QueueOp> = ops.iter().chain(ops.iter()).cloned().collect();
        let mut s = seed | 1;
        for i in (1..shuffled.len()).rev() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            shuffled.swap(i, (s % (i as u64 + 1)) as usize);
        }
        let mut other = BranchQueue::new("main");
        for o in &shuffled {
            other.apply(o, 0);
        }
        prop_assert_eq!(active(&ordered), active(&other));
    }
}
