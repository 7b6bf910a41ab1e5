//! The merge lock and the status-comment lock are two locks (issue 13): a merge lock
//! held on the target branch does not delay the PR's sticky status comment, a status
//! lock held on the PR does not delay its merge, and a held status lock still keeps
//! every other status writer out until it is released. The test holds a lock the way
//! another executor would: the key set with a token no executor uses. The merge lock
//! is a fenced lease (issue 16): an executor that lost it before its merge call never
//! makes the call.

use std::collections::HashMap;
use std::time::Duration;

use super::{BOT_MARKER, REPO};
use crate::support::fake_forgejo::{Fault, NewPr};
use crate::support::poll_until_named;
use crate::support::scenario::{DEADLINE, Scenario};

/// What every status comment carries.
const STATE: &str = "<!-- SHEPHERD-STATE: ";

/// Takes lock `key` as another executor would, for longer than any test runs.
async fn hold(s: &Scenario, key: &str) {
    let taken: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg("held-by-the-test")
        .arg("NX")
        .arg("PX")
        .arg(300_000)
        .query_async(&mut s.redis_conn())
        .await
        .expect("SET");
    assert!(taken.is_some(), "{key} was free");
}

/// Releases a lock [`hold`] took.
async fn release(s: &Scenario, key: &str) {
    let deleted: i64 = redis::cmd("DEL")
        .arg(key)
        .query_async(&mut s.redis_conn())
        .await
        .expect("DEL");
    assert_eq!(deleted, 1, "{key} was still held");
}

/// Whether a status-comment effect of PR `n` waits in the retry set (an executor found
/// the status lock busy and will try again).
async fn status_effect_parked(s: &Scenario, n: u64) -> bool {
    let keys = s.shepherd.keys();
    let record = keys.pr_record(REPO, n);
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(keys.effect_retries(0))
        .arg(0)
        .arg(-1)
        .query_async(&mut s.redis_conn())
        .await
        .expect("ZRANGE");
    members.iter().any(|m| {
        let flat: Vec<String> = serde_json::from_str(m).expect("a parked entry is JSON");
        let fields: HashMap<&str, &str> = flat
            .chunks(2)
            .filter_map(|kv| match kv {
                [k, v] => Some((k.as_str(), v.as_str())),
                _ => None,
            })
            .collect();
        fields.get("kind") == Some(&"upsert-comment") && fields.get("record") == Some(&&*record)
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_merge_lock_does_not_delay_the_status_comment() {
    let s = Scenario::start("").await;
    let n = s.fake.open_pr(REPO, NewPr::new("alice", "Add y"));
    let lock = s.shepherd.keys().merge_lock(REPO, "main");
    hold(&s, &lock).await;

    s.send(&s.fake.pr_opened(REPO, n)).await;
    s.wait_fake(
        "the status comment is posted while the merge lock is held",
        |_| s.comments_containing(REPO, n, STATE) == 1,
    )
    .await;
    assert!(
        !status_effect_parked(&s, n).await,
        "no status effect waited for a lock"
    );
    s.assert_no_duplicate_comments(REPO, n);
    release(&s, &lock).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_status_lock_keeps_status_writers_out_but_not_the_merge() {
    let s = Scenario::start("").await;
    let (n, sha) = open_green_bot_pr(&s, "z");
    let lock = s.shepherd.keys().status_lock(REPO, n);
    hold(&s, &lock).await;

    s.send(&s.fake.pr_opened(REPO, n)).await;
    let review = s.fake.add_review(REPO, n, "bob", "APPROVED");
    s.send(&s.fake.pr_reviewed(REPO, n, review)).await;
    s.wait_fake("the PR is merged while its status lock is held", |f| {
        !f.merges().is_empty()
    })
    .await;
    let merges = s.fake.merges();
    assert_eq!(merges.len(), 1, "merged once");
    assert_eq!(
        merges[0].head_commit_id.as_deref(),
        Some(sha.as_str()),
        "pinned"
    );
    poll_until_named(DEADLINE, "a status effect waits for the lock", || {
        status_effect_parked(&s, n)
    })
    .await;
    assert_eq!(
        s.comments_containing(REPO, n, STATE),
        0,
        "no status writer got past the held lock"
    );

    release(&s, &lock).await;
    s.wait_fake("the status comment is posted once the lock is free", |_| {
        s.comments_containing(REPO, n, STATE) == 1
    })
    .await;
    s.wait_idle().await;
    s.assert_no_duplicate_comments(REPO, n);
    assert_eq!(
        s.comments_containing(REPO, n, STATE),
        1,
        "one status comment"
    );
}

/// The fence (issue 16): while an executor re-checks a PR under the merge lease, the
/// lease is taken from it (as if it had paused past the lease's life and another
/// executor took the branch). It must not call merge; it backs off and retries, and
/// merges — once, pinned — only after the other holder let go.
#[tokio::test(flavor = "multi_thread")]
async fn an_executor_that_lost_the_merge_lease_never_calls_merge() {
    let s = Scenario::start("").await;
    let (n, sha) = open_green_bot_pr(&s, "w");
    let review = s.fake.add_review(REPO, n, "bob", "APPROVED");
    // The re-check's reads are slow, so the lease is held long enough to be taken away.
    s.fake
        .inject(Fault::on("GET", "/repos/*/commits/*/status").delay(Duration::from_millis(1500)));
    s.fake
        .inject(Fault::on("GET", "/repos/*/pulls/*/reviews").delay(Duration::from_millis(1500)));
    let lease = s.shepherd.keys().merge_lock(REPO, "main");
    s.send(&s.fake.pr_opened(REPO, n)).await;
    s.send(&s.fake.pr_reviewed(REPO, n, review)).await;

    let mut conn = s.redis_conn();
    poll_until_named(DEADLINE, "an executor takes the merge lease", || {
        let (mut conn, lease) = (conn.clone(), lease.clone());
        async move {
            let holder: Option<String> = redis::cmd("GET")
                .arg(&lease)
                .query_async(&mut conn)
                .await
                .expect("GET");
            holder.is_some()
        }
    })
    .await;
    let stolen_at = std::time::Instant::now();
    let _: () = redis::cmd("SET")
        .arg(&lease)
        .arg("held-by-the-test")
        .arg("PX")
        .arg(300_000)
        .query_async(&mut conn)
        .await
        .expect("SET");
    // The executor finishes its re-check, is refused by the fence and tries again
    // later: each try starts with a read of the PR.
    let pr_path = format!("/repos/{REPO}/pulls/{n}");
    s.wait_fake("the executor tried again after losing the lease", |f| {
        f.calls("GET", &pr_path)
            .iter()
            .filter(|c| c.at > stolen_at + Duration::from_millis(3000))
            .count()
            >= 1
    })
    .await;
    assert!(
        s.fake.merges().is_empty() && s.fake.calls("POST", &format!("{pr_path}/merge")).is_empty(),
        "no merge call without the lease"
    );

    release(&s, &lease).await;
    s.wait_fake("merged once the lease is free", |f| !f.merges().is_empty())
        .await;
    s.fake.clear_faults();
    s.wait_idle().await;
    let merges = s.fake.merges();
    assert_eq!(merges.len(), 1, "merged once");
    assert_eq!(
        merges[0].head_commit_id.as_deref(),
        Some(sha.as_str()),
        "pinned"
    );
    assert_eq!(
        s.fake.calls("POST", &format!("{pr_path}/merge")).len(),
        1,
        "one merge call"
    );
}

/// Opens a bot PR "Add `what`" whose head's CI is green; returns its number and head.
fn open_green_bot_pr(s: &Scenario, what: &str) -> (u64, String) {
    let body = format!("Adds {what}.\n\n{BOT_MARKER}");
    let n = s.fake.open_pr(
        REPO,
        NewPr::new("agent-bot", &format!("Add {what}")).body(&body),
    );
    let sha = s.fake.head_sha(REPO, n);
    s.fake
        .set_status(REPO, &sha, "ci/test", "success", "all green");
    (n, sha)
}
