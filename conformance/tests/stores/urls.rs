//! Every store handle's `url()` is in the form its adapter's `connect` (and
//! `distlock::connect`) accepts, as the adapter's README documents it; the
//! variables' old names still work, converted, with a one-line warning.

use std::process::Command;

use lock_conformance::kit::env;
use lock_conformance::kit::pki::TestCa;

use super::*;

/// What each adapter's README documents: the scheme its `connect` takes
/// (with the TLS one where there is one).
const DOCUMENTED: &[(Kind, &str, &[&str])] = &[
    (
        Kind::Redis,
        "lock-redis/README.md",
        &["redis://", "rediss://"],
    ),
    (Kind::Postgres, "lock-postgres/README.md", &["postgres://"]),
    (Kind::Etcd, "lock-etcd/README.md", &["etcd://", "etcds://"]),
    (
        Kind::ZooKeeper,
        "lock-zookeeper/README.md",
        &["zk://", "zks://"],
    ),
];

fn readme(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Checks `url` is `scheme://[userinfo@]host:port[,host:port...][/...|?...]`
/// with a scheme `kind`'s README documents and the ports `ports`.
pub(crate) fn assert_connect_form(kind: Kind, url: &str, tls: bool, ports: &[u16]) {
    let (_, readme_path, schemes) = DOCUMENTED
        .iter()
        .find(|(k, ..)| *k == kind)
        .expect("documented");
    let text = readme(readme_path);
    let scheme = schemes[usize::from(tls)];
    assert!(
        text.contains(scheme),
        "{readme_path} no longer documents {scheme}"
    );
    let rest = url
        .strip_prefix(scheme)
        .unwrap_or_else(|| panic!("{kind}: {url} does not start with {scheme}"));
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    let hosts = authority.rsplit('@').next().unwrap_or_default();
    let found: Vec<u16> = hosts
        .split(',')
        .map(|host| {
            let (name, port) = host
                .rsplit_once(':')
                .unwrap_or_else(|| panic!("{kind}: {url}: `{host}` is not host:port"));
            assert!(!name.is_empty(), "{kind}: {url}: no host in `{host}`");
            port.parse()
                .unwrap_or_else(|e| panic!("{kind}: {url}: port of `{host}`: {e}"))
        })
        .collect();
    assert_eq!(found, ports, "{kind}: {url}");
}

#[test]
fn store_urls_are_what_the_adapters_connect_takes() {
    for (kind, store) in [
        (Kind::Redis, redis::try_shared()),
        (Kind::Postgres, postgres::try_shared()),
        (Kind::Etcd, etcd::try_shared()),
        (Kind::ZooKeeper, zookeeper::try_shared()),
    ] {
        let store = store.unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert_connect_form(kind, &store.url(), false, &[store.addr().port()]);
        let via: SocketAddr = "127.0.0.1:23999".parse().unwrap();
        assert_connect_form(kind, &store.url_via(via), false, &[via.port()]);
        if store.is_external() {
            continue;
        }
        // What the store's own CLI takes, for the launched ones.
        let endpoint = store.endpoint();
        let want = match kind {
            Kind::Etcd => format!("http://{}", store.addr()),
            Kind::ZooKeeper => store.addr().to_string(),
            _ => store.url(),
        };
        assert_eq!(endpoint, want, "{kind}");
    }
}

#[test]
fn tls_store_urls_use_the_tls_schemes() {
    if !launcher_run(&[Kind::Redis, Kind::Etcd, Kind::ZooKeeper]) {
        return;
    }
    let ca = TestCa::new("urls test CA");
    let server = ca.server();
    let redis = redis::start(redis::Options::default().tls(redis::Tls::new(
        server.cert.clone(),
        server.key.clone(),
        ca.pem(),
    )))
    .unwrap();
    assert_connect_form(Kind::Redis, &redis.url(), true, &[redis.addr().port()]);
    let etcd = etcd::start(etcd::Options::default().tls(etcd::ClientTls::new(
        ca.pem(),
        server.cert,
        server.key,
    )))
    .unwrap();
    assert_connect_form(Kind::Etcd, &etcd.url(), true, &[etcd.addr().port()]);
    assert_eq!(etcd.endpoint(), format!("https://{}", etcd.addr()));
    let server = ca.server();
    let zk = zookeeper::start(zookeeper::Options::default().tls(zookeeper::ClientTls::new(
        ca.pem(),
        server.cert,
        server.key,
    )))
    .unwrap();
    assert_connect_form(Kind::ZooKeeper, &zk.url(), true, &[zk.addr().port()]);
    // The URL names the CA's PEM file, which the store keeps while it runs.
    let url = zk.url();
    let (_, query) = url.split_once('?').expect(&url);
    let ca_file = (query.split('&'))
        .find_map(|option| option.strip_prefix("tls_ca="))
        .expect(&url);
    assert_eq!(std::fs::read_to_string(ca_file).unwrap(), ca.pem());
    assert_eq!(zk.endpoint(), zk.addr().to_string());
}

/// Run by `old_variable_names_still_work_with_a_warning` in a child process.
#[test]
#[ignore = "helper: run by old_variable_names_still_work_with_a_warning"]
fn helper_print_external_urls() {
    if std::env::var("DISTLOCK_URLS_HELPER").as_deref() != Ok("1") {
        return;
    }
    for (kind, store) in [
        (Kind::Etcd, etcd::try_shared()),
        (Kind::ZooKeeper, zookeeper::try_shared()),
    ] {
        let store = store.unwrap_or_else(|e| panic!("{kind}: {e}"));
        println!(
            "URL {kind} {} external={} serves={}",
            store.url(),
            store.is_external(),
            store.serves()
        );
    }
}

#[test]
fn old_variable_names_still_work_with_a_warning() {
    if !launcher_run(&[Kind::Etcd, Kind::ZooKeeper]) {
        return;
    }
    let (etcd, zk) = (etcd::shared(), zookeeper::shared());
    let run = |vars: &[(&str, String)]| {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--ignored",
            "--exact",
            "urls::helper_print_external_urls",
            "--nocapture",
        ])
        .env("DISTLOCK_URLS_HELPER", "1");
        for var in env::ALL {
            cmd.env_remove(var.name());
            if let Some(old) = var.old_name() {
                cmd.env_remove(old);
            }
        }
        for (name, value) in vars {
            cmd.env(name, value);
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stdout}{stderr}");
        (stdout, stderr)
    };
    let etcd_url = format!("etcd://{}", etcd.addr());
    let zk_url = format!("zk://{}", zk.addr());
    let want = [
        format!("URL etcd {etcd_url} external=true serves=true"),
        format!("URL zookeeper {zk_url} external=true serves=true"),
    ];

    // Old names, old value forms: converted, one warning line each.
    let (stdout, stderr) = run(&[
        (
            "LOCK_TEST_ETCD_ENDPOINTS",
            format!("http://{}", etcd.addr()),
        ),
        ("LOCK_TEST_ZOOKEEPER", zk.addr().to_string()),
    ]);
    for line in &want {
        assert!(stdout.contains(line.as_str()), "{line}: {stdout}");
    }
    for (old, new) in [
        (
            "LOCK_TEST_ETCD_ENDPOINTS",
            format!("LOCK_TEST_ETCD_URL={etcd_url}"),
        ),
        (
            "LOCK_TEST_ZOOKEEPER",
            format!("LOCK_TEST_ZOOKEEPER_URL={zk_url}"),
        ),
    ] {
        let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains(old)).collect();
        assert_eq!(warnings.len(), 1, "one warning for {old}: {stderr}");
        assert!(
            warnings[0].starts_with("warning: ") && warnings[0].contains(&new),
            "{}",
            warnings[0]
        );
    }

    // New names: no warning. Both: the new one wins, the old one is ignored, saying so.
    let (stdout, stderr) = run(&[
        ("LOCK_TEST_ETCD_URL", etcd_url.clone()),
        ("LOCK_TEST_ZOOKEEPER_URL", zk_url.clone()),
        ("LOCK_TEST_ZOOKEEPER", "127.0.0.1:1".to_owned()),
    ]);
    for line in &want {
        assert!(stdout.contains(line.as_str()), "{line}: {stdout}");
    }
    assert!(!stderr.contains("ETCD"), "{stderr}");
    assert!(
        stderr.contains("LOCK_TEST_ZOOKEEPER is ignored: LOCK_TEST_ZOOKEEPER_URL is set"),
        "{stderr}"
    );
}
