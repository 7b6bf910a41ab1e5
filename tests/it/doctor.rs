//! `shepherd doctor` through the real binary, against a real redis-server and the fake
//! Forgejo: a healthy setup passes every check (exit 0), and each failure in turn
//! turns its own line to ✗ with a fix (exit 1). Doctor never writes to Forgejo and
//! never prints a secret.

use std::time::Duration;

use crate::support::TEST_SECRET;
use crate::support::fake_forgejo::{BOT, FakeForgejo, TOKEN};
use crate::support::redis::{Aof, RedisServer, free_port};

/// The reviewer agent's login and token in the agent tests.
const REVIEWER: &str = "rev-one";
const REVIEWER_TOKEN: &str = "reviewer-token-0123456789";

/// A policy naming one reviewer agent.
const REVIEWER_POLICY: &str = "[defaults]\nreviewer_logins = [\"rev-one\"]\n";

/// What one run of `shepherd doctor` printed.
struct Outcome {
    /// Exit status 0.
    success: bool,
    /// Its stdout (the checklist).
    stdout: String,
    /// Its stderr.
    stderr: String,
}

impl Outcome {
    /// The line of check `name` and its fix line, if any.
    fn check(&self, name: &str) -> String {
        let mut lines = self.stdout.lines();
        while let Some(line) = lines.next() {
            let rest = line
                .strip_prefix("✓ ")
                .or_else(|| line.strip_prefix("✗ "))
                .unwrap_or_default();
            if rest.starts_with(&format!("{name}  ")) || rest.starts_with(&format!("{name} ")) {
                let fix = lines
                    .next()
                    .filter(|l| l.trim_start().starts_with("fix:"))
                    .unwrap_or_default();
                return format!("{line}\n{fix}");
            }
        }
        panic!("no line for {name:?} in:\n{}", self.stdout);
    }

    /// Whether check `name` passed.
    fn passed(&self, name: &str) -> bool {
        self.check(name).starts_with('✓')
    }

    /// Asserts that check `name` failed and its line (with the fix) contains `words`.
    fn assert_failed(&self, name: &str, words: &[&str]) {
        let text = self.check(name);
        assert!(
            text.starts_with('✗'),
            "{name} should fail:\n{}",
            self.stdout
        );
        assert!(
            text.contains("fix: "),
            "{name} has no fix:\n{}",
            self.stdout
        );
        for w in words {
            assert!(
                text.contains(w),
                "{name} should say {w:?}:\n{}",
                self.stdout
            );
        }
        assert!(
            !self.success,
            "a failed check exits non-zero:\n{}",
            self.stdout
        );
    }
}

/// A setup doctor is run against: env on top of the healthy defaults.
struct Setup {
    env: Vec<(String, String)>,
    policy: Option<tempfile::NamedTempFile>,
}

impl Setup {
    /// Redis, Forgejo, the bot's token and login, a webhook secret: every check passes.
    fn healthy(redis: &RedisServer, forgejo: &FakeForgejo) -> Self {
        let env = [
            ("SHEPHERD_REDIS_URL", redis.url()),
            ("SHEPHERD_FORGEJO_URL", forgejo.url()),
            ("SHEPHERD_FORGEJO_TOKEN", TOKEN.to_owned()),
            ("SHEPHERD_BOT_LOGIN", BOT.to_owned()),
            ("SHEPHERD_WEBHOOK_SECRETS", TEST_SECRET.to_owned()),
        ];
        Self {
            env: env.map(|(k, v)| (k.to_owned(), v)).to_vec(),
            policy: None,
        }
    }

    /// Also the agent runner: a command on the PATH, a reviewer with its own token.
    fn with_agents(redis: &RedisServer, forgejo: &FakeForgejo) -> Self {
        forgejo.add_user_token(REVIEWER, REVIEWER_TOKEN);
        Self::healthy(redis, forgejo)
            .set("SHEPHERD_AGENT_COMMAND", "true {prompt_file}")
            .set(
                "SHEPHERD_REVIEWER_TOKENS",
                &format!("{REVIEWER}={REVIEWER_TOKEN}"),
            )
            .policy(REVIEWER_POLICY)
    }

    fn set(mut self, key: &str, value: &str) -> Self {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    fn unset(mut self, key: &str) -> Self {
        self.env.retain(|(k, _)| k != key);
        self
    }

    fn policy(mut self, toml: &str) -> Self {
        let file = tempfile::NamedTempFile::new().expect("policy file");
        std::fs::write(file.path(), toml).expect("write the policy");
        self.env
            .push(("SHEPHERD_CONFIG".into(), file.path().display().to_string()));
        self.policy = Some(file);
        self
    }

    /// Runs `shepherd doctor` with this environment (nothing else of `SHEPHERD_*`).
    async fn run(&self) -> Outcome {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_shepherd"));
        for (key, _) in std::env::vars() {
            if key.starts_with("SHEPHERD_") {
                cmd.env_remove(key);
            }
        }
        cmd.arg("doctor").envs(self.env.iter().cloned());
        let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
            .await
            .expect("doctor finishes within a minute")
            .expect("run shepherd doctor");
        let outcome = Outcome {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        for secret in [TOKEN, TEST_SECRET, REVIEWER_TOKEN] {
            assert!(
                !outcome.stdout.contains(secret) && !outcome.stderr.contains(secret),
                "doctor printed a secret:\n{}{}",
                outcome.stdout,
                outcome.stderr
            );
        }
        outcome
    }
}

#[tokio::test]
async fn doctor_passes_every_check_of_a_healthy_setup_and_writes_nothing() {
    let redis = RedisServer::start_with(Aof::Always);
    let forgejo = FakeForgejo::start().await;
    let out = Setup::healthy(&redis, &forgejo).run().await;
    eprintln!("{}", out.stdout);
    assert!(out.success, "{}{}", out.stdout, out.stderr);
    for name in [
        "configuration",
        "redis",
        "redis persistence",
        "forgejo url",
        "forgejo token",
        "bot login",
        "token scopes",
        "webhook secrets",
    ] {
        assert!(out.passed(name), "{name}:\n{}", out.stdout);
    }
    assert!(out.check("redis").contains("Redis 7"), "{}", out.stdout);
    assert!(
        out.check("forgejo url").contains("15.0.3"),
        "{}",
        out.stdout
    );
    assert!(out.check("forgejo token").contains(BOT), "{}", out.stdout);
    assert!(
        out.check("token scopes")
            .contains("cannot be verified without writing"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("all 8 checks passed"), "{}", out.stdout);
    assert!(
        !out.stdout.contains("agent"),
        "no agent checks without SHEPHERD_AGENT_COMMAND"
    );
    assert_eq!(forgejo.writes().len(), 0, "doctor never writes to Forgejo");
    let version_calls = forgejo.calls("GET", "/version");
    assert_eq!(version_calls.len(), 1, "{version_calls:?}");
    forgejo.assert_calls_match_openapi();
}

#[tokio::test]
async fn doctor_checks_the_agent_runner_when_an_agent_command_is_set() {
    let redis = RedisServer::start_with(Aof::Always);
    let forgejo = FakeForgejo::start().await;
    let out = Setup::with_agents(&redis, &forgejo).run().await;
    eprintln!("{}", out.stdout);
    assert!(out.success, "{}{}", out.stdout, out.stderr);
    for name in [
        "agent settings",
        "agent command",
        "agent sandbox",
        "reviewer tokens",
    ] {
        assert!(out.passed(name), "{name}:\n{}", out.stdout);
    }
    assert!(
        out.check("agent command").contains("/true"),
        "{}",
        out.stdout
    );
    assert!(
        out.check("reviewer tokens").contains(REVIEWER),
        "{}",
        out.stdout
    );
    assert_eq!(forgejo.writes().len(), 0);
    forgejo.assert_calls_match_openapi();
}

#[tokio::test]
async fn doctor_reports_an_invalid_configuration_as_its_first_check() {
    let redis = RedisServer::start_with(Aof::Always);
    let forgejo = FakeForgejo::start().await;
    let out = Setup::healthy(&redis, &forgejo)
        .set("SHEPHERD_LISTEN", "not-an-address")
        .run()
        .await;
    out.assert_failed("configuration", &["SHEPHERD_LISTEN"]);
    assert!(
        out.stdout.contains("0 of 1 checks passed"),
        "{}",
        out.stdout
    );
    let out = Setup::healthy(&redis, &forgejo)
        .policy("[defaults]\nno_such_setting = 1\n")
        .run()
        .await;
    out.assert_failed("configuration", &["policy file", "SHEPHERD_CONFIG"]);
}

#[tokio::test]
async fn doctor_fails_when_redis_is_down() {
    let forgejo = FakeForgejo::start().await;
    let mut redis = RedisServer::start_with(Aof::Always);
    redis.stop();
    let out = Setup::healthy(&redis, &forgejo).run().await;
    out.assert_failed("redis", &["cannot reach Redis", "SHEPHERD_REDIS_URL"]);
    out.assert_failed("redis persistence", &["not checked"]);
    assert!(out.passed("forgejo token"), "the other checks still run");
}

#[tokio::test]
async fn doctor_never_prints_the_redis_password() {
    let forgejo = FakeForgejo::start().await;
    let port = free_port();
    let out = Setup::healthy(&RedisServer::start(), &forgejo)
        .set(
            "SHEPHERD_REDIS_URL",
            &format!("redis://:pa55word-xyz@127.0.0.1:{port}"),
        )
        .run()
        .await;
    out.assert_failed("redis", &[":***@127.0.0.1"]);
    assert!(!out.stdout.contains("pa55word-xyz"), "{}", out.stdout);
}

#[tokio::test]
async fn doctor_says_what_each_redis_persistence_setting_loses() {
    let redis = RedisServer::start();
    let forgejo = FakeForgejo::start().await;
    let setup = Setup::healthy(&redis, &forgejo);
    let out = setup.run().await;
    assert!(out.passed("redis"), "{}", out.stdout);
    out.assert_failed(
        "redis persistence",
        &["no persistence at all", "appendfsync always"],
    );
    redis.cli(&["CONFIG", "SET", "save", "3600 1"]).unwrap();
    setup.run().await.assert_failed(
        "redis persistence",
        &["only RDB snapshots", "since the last snapshot"],
    );
    redis.cli(&["CONFIG", "SET", "appendonly", "yes"]).unwrap();
    setup
        .run()
        .await
        .assert_failed("redis persistence", &["everysec", "last second"]);
    redis
        .cli(&["CONFIG", "SET", "appendfsync", "always"])
        .unwrap();
    let out = setup.run().await;
    assert!(out.passed("redis persistence"), "{}", out.stdout);
    assert!(out.success, "{}", out.stdout);
}

#[tokio::test]
async fn doctor_fails_when_forgejo_is_unreachable_or_unset() {
    let redis = RedisServer::start_with(Aof::Always);
    let forgejo = FakeForgejo::start().await;
    let url = format!("http://127.0.0.1:{}", free_port());
    let out = Setup::healthy(&redis, &forgejo)
        .set("SHEPHERD_FORGEJO_URL", &url)
        .run()
        .await;
    out.assert_failed("forgejo url", &["cannot reach", &url]);
    out.assert_failed("forgejo token", &["not verified"]);
    out.assert_failed("token scopes", &["not checked"]);
    let out = Setup::healthy(&redis, &forgejo)
        .unset("SHEPHERD_FORGEJO_URL")
        .run()
        .await;
    out.assert_failed(
        "forgejo url",
        &["SHEPHERD_FORGEJO_URL is not set", "executor"],
    );
    out.assert_failed("forgejo token", &["not checked"]);
}

#[tokio::test]
async fn doctor_fails_on_a_token_forgejo_refuses() {
    let redis = RedisServer::start_with(Aof::Always);
    let forgejo = FakeForgejo::start().await;
    let out = Setup::healthy(&redis, &forgejo)
        .set("SHEPHERD_FORGEJO_TOKEN", "not-the-token")
        .run()
        .await;
    assert!(out.passed("forgejo url"), "{}", out.stdout);
    out.assert_failed("forgejo token", &["refuses", "401"]);
    out.assert_failed("bot login", &["not checked"]);
    out.assert_failed("token scopes", &["not checked"]);
    assert!(!out.stdout.contains("not-the-token"), "{}", out.stdout);
    let out = Setup::healthy(&redis, &forgejo)
        .unset("SHEPHERD_FORGEJO_TOKEN")
        .run()
        .await;
    out.assert_failed("forgejo token", &["SHEPHERD_FORGEJO_TOKEN is not set"]);
}

#[tokio::test]
async fn doctor_fails_when_the_token_is_not_the_bot_logins() {
    let redis = RedisServer::start_with(Aof::Always);
    let forgejo = FakeForgejo::start().await;
    let out = Setup::healthy(&redis, &forgejo)
        .set("SHEPHERD_BOT_LOGIN", "other-bot")
        .run()
        .await;
    assert!(out.passed("forgejo token"), "{}", out.stdout);
    out.assert_failed(
        "bot login",
        &[&format!("belongs to {BOT}"), "SHEPHERD_BOT_LOGIN=other-bot"],
    );
    let out = Setup::healthy(&redis, &forgejo)
        .unset("SHEPHERD_BOT_LOGIN")
        .run()
        .await;
    out.assert_failed(
        "bot login",
        &["not set", &format!("SHEPHERD_BOT_LOGIN={BOT}")],
    );
}

#[tokio::test]
async fn doctor_fails_when_the_token_lacks_a_scope() {
    let redis = RedisServer::start_with(Aof::Always);
    let forgejo = FakeForgejo::start().await;
    forgejo.limit_token_scopes(TOKEN, &["write:repository", "read:user"]);
    let out = Setup::healthy(&redis, &forgejo).run().await;
    assert!(out.passed("forgejo token"), "{}", out.stdout);
    assert!(out.passed("bot login"), "{}", out.stdout);
    out.assert_failed("token scopes", &["issue", "read:issue", "write:issue"]);
    assert!(
        !out.check("token scopes").contains("lacks repository"),
        "{}",
        out.stdout
    );
}

#[tokio::test]
async fn doctor_says_when_the_token_may_not_read_its_own_user() {
    let redis = RedisServer::start_with(Aof::Always);
    let forgejo = FakeForgejo::start().await;
    forgejo.limit_token_scopes(TOKEN, &["write:repository", "write:issue"]);
    let out = Setup::healthy(&redis, &forgejo).run().await;
    out.assert_failed("forgejo token", &["valid", "read:user"]);
    out.assert_failed("bot login", &["unknown"]);
    assert!(out.passed("token scopes"), "{}", out.stdout);
}

#[tokio::test]
async fn doctor_fails_without_webhook_secrets() {
    let redis = RedisServer::start_with(Aof::Always);
    let forgejo = FakeForgejo::start().await;
    let out = Setup::healthy(&redis, &forgejo)
        .unset("SHEPHERD_WEBHOOK_SECRETS")
        .run()
        .await;
    out.assert_failed("webhook secrets", &["none", "SHEPHERD_WEBHOOK_SECRETS"]);
    let out = Setup::healthy(&redis, &forgejo)
        .unset("SHEPHERD_WEBHOOK_SECRETS")
        .policy("[webhooks.\"acme\"]\nsecret_env = \"IT_DOCTOR_ACME_SECRET\"\n")
        .run()
        .await;
    out.assert_failed("webhook secrets", &["IT_DOCTOR_ACME_SECRET"]);
}

#[tokio::test]
async fn doctor_fails_when_the_agent_command_is_missing() {
    let redis = RedisServer::start_with(Aof::Always);
    let forgejo = FakeForgejo::start().await;
    let out = Setup::with_agents(&redis, &forgejo)
        .set(
            "SHEPHERD_AGENT_COMMAND",
            "no-such-agent-cli run {prompt_file}",
        )
        .run()
        .await;
    out.assert_failed("agent command", &["no-such-agent-cli", "not found on PATH"]);
    assert!(out.passed("agent sandbox"), "{}", out.stdout);
    let out = Setup::with_agents(&redis, &forgejo)
        .set("SHEPHERD_AGENT_COMMAND", "'unclosed")
        .run()
        .await;
    out.assert_failed("agent settings", &["SHEPHERD_AGENT_COMMAND"]);
}

#[tokio::test]
async fn doctor_fails_when_the_sandbox_is_off_or_cannot_start() {
    let redis = RedisServer::start_with(Aof::Always);
    let forgejo = FakeForgejo::start().await;
    let out = Setup::with_agents(&redis, &forgejo)
        .set("SHEPHERD_AGENT_SANDBOX", "off")
        .run()
        .await;
    out.assert_failed("agent sandbox", &["sandbox off", "warning"]);
    // A host that refuses user namespaces: bwrap (first on the PATH) fails as it does
    // there; the runner's own probe says so.
    let bin = tempfile::tempdir().expect("a temp dir");
    // Runnable by the agents' uid, which a root runner starts bwrap as.
    std::fs::set_permissions(
        bin.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("open the folder");
    let bwrap = bin.path().join("bwrap");
    std::fs::write(
        &bwrap,
        "#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n",
    )
    .expect("write the failing bwrap");
    std::fs::set_permissions(&bwrap, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("make it executable");
    let path = format!("{}:/usr/bin:/bin", bin.path().display());
    let out = Setup::with_agents(&redis, &forgejo)
        .set("SHEPHERD_AGENT_COMMAND", "/bin/true {prompt_file}")
        .set("PATH", &path)
        .run()
        .await;
    assert!(out.passed("agent command"), "{}", out.stdout);
    out.assert_failed("agent sandbox", &["No permissions to create new namespace"]);
    // A writable path holding the work dir would show every item's folder: refused.
    let out = Setup::with_agents(&redis, &forgejo)
        .set("SHEPHERD_AGENT_SANDBOX_WRITABLE", "/")
        .run()
        .await;
    out.assert_failed(
        "agent sandbox",
        &["SHEPHERD_AGENT_SANDBOX_WRITABLE", "work dir"],
    );
}

#[tokio::test]
async fn doctor_fails_on_a_reviewer_token_of_the_wrong_user() {
    let redis = RedisServer::start_with(Aof::Always);
    let forgejo = FakeForgejo::start().await;
    forgejo.add_user_token("rev-two", "rev-two-token-0123456789");
    let out = Setup::with_agents(&redis, &forgejo)
        .set(
            "SHEPHERD_REVIEWER_TOKENS",
            "rev-one=rev-two-token-0123456789",
        )
        .run()
        .await;
    out.assert_failed(
        "reviewer tokens",
        &["the token given for rev-one belongs to rev-two"],
    );
    assert!(!out.stdout.contains("rev-two-token"), "{}", out.stdout);
    // A token of a user the policy does not name, and a reviewer without a token.
    let out = Setup::with_agents(&redis, &forgejo)
        .set(
            "SHEPHERD_REVIEWER_TOKENS",
            "rev-two=rev-two-token-0123456789",
        )
        .run()
        .await;
    out.assert_failed(
        "reviewer tokens",
        &[
            "rev-two is not one of the policy's reviewer_logins",
            "no token for rev-one",
        ],
    );
    // A token Forgejo refuses.
    let out = Setup::with_agents(&redis, &forgejo)
        .set("SHEPHERD_REVIEWER_TOKENS", "rev-one=not-a-token")
        .run()
        .await;
    out.assert_failed("reviewer tokens", &["rev-one's token", "401"]);
}
