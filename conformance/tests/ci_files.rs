//! The container files users' CI runs the suite with: they must parse and
//! agree with each other and with the launcher's settings.

use std::collections::BTreeSet;
use std::path::PathBuf;

use lock_conformance::cases::PRIVATE_STORE_CASES;
use lock_conformance::kit::env;
use lock_conformance::{CASES, EXPECT_SKIPS_ENV};
use yaml_rust2::{Yaml, YamlLoader};

fn load(relative: &str) -> Yaml {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut docs = YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("{relative} is not valid YAML: {e}"));
    assert_eq!(docs.len(), 1, "{relative}: one document");
    docs.remove(0)
}

fn words(y: &Yaml) -> String {
    match y {
        Yaml::Array(items) => items.iter().map(words).collect::<Vec<_>>().join(" "),
        Yaml::String(s) => s.clone(),
        Yaml::Integer(i) => i.to_string(),
        other => format!("{other:?}"),
    }
}

#[test]
fn compose_file_starts_the_four_stores_durably() {
    let compose = load("ci/docker-compose.yml");
    let services = &compose["services"];
    for (name, port) in [
        ("redis", "6379"),
        ("postgres", "5432"),
        ("etcd", "2379"),
        ("zookeeper", "2181"),
    ] {
        let service = &services[name];
        assert!(service["image"].as_str().is_some(), "{name} has an image");
        let ports = words(&service["ports"]);
        assert!(
            ports.contains(&format!("127.0.0.1:{port}:{port}")),
            "{name} publishes {port} on loopback: {ports}"
        );
        assert!(
            !service["healthcheck"]["test"].is_badvalue(),
            "{name} has a health check (for up --wait)"
        );
    }
    let redis = words(&services["redis"]["command"]);
    assert!(
        redis.contains("--appendonly yes") && redis.contains("--appendfsync always"),
        "{redis}"
    );
    let etcd = words(&services["etcd"]["command"]);
    assert!(
        etcd.contains("--election-timeout=100"),
        "1 s leases need a short election timeout: {etcd}"
    );
    let zk = &services["zookeeper"]["environment"];
    assert!(words(&zk["ZOO_CFG_EXTRA"]).contains("minSessionTimeout=1000"));
    assert!(words(&zk["ZOO_4LW_COMMANDS_WHITELIST"]).contains("srvr"));
    assert_eq!(
        words(&services["postgres"]["environment"]["POSTGRES_HOST_AUTH_METHOD"]),
        "trust"
    );
}

#[test]
fn workflow_runs_the_suite_against_the_containers() {
    let workflow = load(".github/workflows/stores.yml");
    assert!(!workflow["on"].is_badvalue(), "the workflow has triggers");
    let job = &workflow["jobs"]["conformance"];
    let env = &job["env"];
    assert_eq!(words(&env["CI"]), "true");
    // One URL per store, each in the form `distlock::connect` accepts, at
    // the port the compose file publishes.
    for (var, want) in [
        (env::REDIS_URL, "redis://127.0.0.1:6379"),
        (
            env::POSTGRES_URL,
            "postgres://postgres@127.0.0.1:5432/postgres",
        ),
        (env::ETCD_URL, "etcd://127.0.0.1:2379"),
        // The container starts ZooKeeper with TTL nodes swept every 200 ms.
        (
            env::ZOOKEEPER_URL,
            "zk://127.0.0.1:2181?container_check_interval=200ms",
        ),
    ] {
        assert_eq!(words(&env[var.name()]), want, "{var}");
    }
    assert!(
        env[EXPECT_SKIPS_ENV].is_badvalue(),
        "{EXPECT_SKIPS_ENV} is set per backend step, not for the whole job"
    );
    let steps = job["steps"].as_vec().expect("steps");
    let runs: Vec<String> = steps.iter().map(|s| words(&s["run"])).collect();
    let up = runs
        .iter()
        .position(|r| r.contains("docker compose -f ci/docker-compose.yml up -d --wait"));
    let first_test = runs.iter().position(|r| r.contains("cargo test"));
    assert!(
        matches!((up, first_test), (Some(u), Some(t)) if u < t),
        "stores start before the tests: {runs:?}"
    );
    assert!(
        runs.iter().any(|r| r.contains("protobuf-compiler")),
        "protoc for etcd-client"
    );
    assert!(
        runs.iter()
            .any(|r| r.contains("--test broken ") && r.contains("--test broken_over_redis")),
        "the suite's own tests run against the containers too: {runs:?}"
    );
    for adapter in ["lock-redis", "lock-postgres", "lock-etcd", "lock-zookeeper"] {
        let command = format!("cargo test -p {adapter} --all-features --test conformance");
        let step = steps
            .iter()
            .find(|s| words(&s["run"]).contains(&command))
            .unwrap_or_else(|| panic!("no step runs `{command}`: {runs:?}"));
        let listed = words(&step["env"][EXPECT_SKIPS_ENV]);
        let listed: BTreeSet<&str> = listed.split(',').map(str::trim).collect();
        for name in &listed {
            assert!(
                CASES.iter().any(|c| c.name == *name),
                "{adapter}: {EXPECT_SKIPS_ENV} names `{name}`, which is not a case"
            );
        }
        let private: BTreeSet<&str> = PRIVATE_STORE_CASES.iter().copied().collect();
        assert_eq!(
            listed, private,
            "{adapter}: against external stores exactly the cases that need a store of their \
             own skip beyond the adapter's declared ones; {EXPECT_SKIPS_ENV} must list them"
        );
    }
}

/// Whether `line` names the variable `var` (not merely a longer name that
/// starts with it: `LOCK_TEST_ZOOKEEPER_TLS` is not `LOCK_TEST_ZOOKEEPER`).
fn names(line: &str, var: &str) -> bool {
    line.match_indices(var).any(|(at, _)| {
        !line[at + var.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// The CI files, the test-all script and the testing guide use the
/// variables' current names only, and name every store by its URL variable.
#[test]
fn ci_files_use_the_current_variable_names() {
    for relative in [
        ".github/workflows/stores.yml",
        "ci/docker-compose.yml",
        "docs/testing.md",
    ] {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(relative);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{relative}: {e}"));
        for var in env::ALL {
            if let Some(old) = var.old_name() {
                // The guide's table of renamed variables may name old ones.
                let mentions = text
                    .lines()
                    .filter(|l| names(l, old) && !names(l, var.name()))
                    .count();
                assert_eq!(mentions, 0, "{relative} still uses {old}: use {var}");
            }
        }
        for var in [
            env::REDIS_URL,
            env::POSTGRES_URL,
            env::ETCD_URL,
            env::ZOOKEEPER_URL,
        ] {
            assert!(text.contains(var.name()), "{relative} does not name {var}");
        }
    }
}

/// `PRIVATE_STORE_CASES` is what the cases' code says: exactly the cases
/// that ask for a private store.
#[test]
fn private_store_cases_are_the_ones_that_ask_for_one() {
    let mut files = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/cases")];
    let mut asking = BTreeSet::new();
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(
                std::fs::read_dir(&path)
                    .expect("a case dir")
                    .map(|e| e.expect("an entry").path()),
            );
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a case file");
        for body in text.split("pub async fn ").skip(1) {
            let name = body.split('(').next().unwrap_or_default().to_owned();
            if body.contains(".private_store(") || body.contains(".private_factory(") {
                asking.insert(name);
            }
        }
    }
    let declared: BTreeSet<String> = PRIVATE_STORE_CASES.iter().map(|s| s.to_string()).collect();
    assert_eq!(asking, declared);
}
