//! ZooKeeper: standalone (`ZooKeeperServerMain`, plaintext or TLS on the
//! client port) or a 3-server ensemble (`QuorumPeerMain`), from a generated
//! `zoo.cfg`.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;

pub use super::ClientTls;
use super::client_tls::write_pem;
use super::{Cluster, Kind, Launch, SharedSlot, Spec, Store, net};
use crate::kit::env;
use crate::kit::pki::{Identity, TestCa};

const JAR: &str = "/usr/share/java/zookeeper.jar";
const SLF4J_SIMPLE: &str = "/usr/share/java/slf4j-simple.jar";
/// Netty's codecs, which TLS on the client port needs (Netty's `SslHandler`
/// is a decoder) and Debian's zookeeper.jar does not name in its class
/// path: it is in `libnetty-java`, which the `zookeeper` package pulls in.
const NETTY_CODEC: &str = "/usr/share/java/netty-codec.jar";

/// The CA's PEM file in a TLS server's data dir (its URL's `tls_ca`).
const CA_FILE: &str = "tls-ca.pem";

/// Launch options.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Options {
    /// `tickTime` in ms (default 250). Session expiry is checked per tick, so
    /// a small tick keeps 1 s sessions precise.
    pub tick_ms: u32,
    /// `minSessionTimeout` in ms (default 1000: 1 s sessions are allowed).
    pub min_session_ms: u32,
    /// `maxSessionTimeout` in ms (default 60000).
    pub max_session_ms: u32,
    /// TTL nodes (`-Dzookeeper.extendedTypesEnabled=true`, default on):
    /// what the backend keeps a lock with once `set_remaining` outlives
    /// its session (`at_least` of jobs).
    pub extended_types: bool,
    /// `-Dznode.container.checkIntervalMs` (default 200; the server's own
    /// is a minute): how often the server deletes expired TTL nodes (and
    /// empty containers), so how late a kept lock is freed. The store's
    /// URL tells the backend (`container_check_interval`).
    pub container_check_ms: u32,
    /// Refuse clients that do not authenticate with the digest scheme
    /// (`enforce.auth.enabled`, ZooKeeper 3.7+; default off). Digest
    /// credentials themselves are never refused: a wrong password is another
    /// identity, which ACLs keep out.
    pub require_digest: bool,
    /// Require SASL of every client (`zookeeper.sessionRequireClientSASLAuth`),
    /// DIGEST-MD5 with these users and passwords (a JAAS `Server` section,
    /// `SASLAuthenticationProvider`); default none: SASL off. A wrong
    /// password, or none, is refused at connect.
    pub sasl_users: Vec<(String, String)>,
    /// Serve clients over TLS only (default: plaintext, or with
    /// `LOCK_TEST_ZOOKEEPER_TLS=1` TLS from a CA of the server's own).
    /// Standalone only; the store's URL names the CA's PEM file (`tls_ca`).
    pub tls: Option<ClientTls>,
}

impl Options {
    /// Serves clients over TLS only, on the secure client port (the URL is
    /// then `zks://127.0.0.1:P`; clients add `?tls_ca=`).
    pub fn tls(mut self, tls: ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Requires SASL DIGEST-MD5 of every client, and lets `user` in with
    /// `password` (call again for more users); see [`sasl_users`](Self::sasl_users).
    pub fn require_sasl(mut self, user: &str, password: &str) -> Self {
        self.sasl_users.push((user.to_owned(), password.to_owned()));
        self
    }
}

/// Writes the JAAS file of a server that knows `users` (SASL DIGEST-MD5)
/// into `dir`; the JVM properties that require SASL of every client.
fn write_jaas(users: &[(String, String)], dir: &Path) -> io::Result<Vec<String>> {
    let quoted = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    let users: String = (users.iter())
        .map(|(user, password)| format!("\n    user_{user}=\"{}\"", quoted(password)))
        .collect();
    let jaas = format!(
        "Server {{\n    org.apache.zookeeper.server.auth.DigestLoginModule required{users};\n}};\n"
    );
    let file = write_pem(dir, "jaas.conf", &jaas, 0o600)?;
    Ok(vec![
        format!("-Djava.security.auth.login.config={}", file.display()),
        "-Dzookeeper.authProvider.1=org.apache.zookeeper.server.auth.SASLAuthenticationProvider"
            .to_owned(),
        "-Dzookeeper.sessionRequireClientSASLAuth=true".to_owned(),
    ])
}

/// Writes the key store (key and certificate in one PEM file, as
/// ZooKeeper reads it) and the trust store into `dir`; the `zoo.cfg` lines
/// that make the client port the secure one (Netty, `secureClientPort`).
fn write_tls(tls: &ClientTls, dir: &Path) -> io::Result<String> {
    let keystore = format!("{}{}", tls.key_pem, tls.cert_pem);
    let keystore = write_pem(dir, "tls-server.pem", &keystore, 0o600)?;
    let truststore = write_pem(dir, CA_FILE, &tls.ca_pem, 0o644)?;
    let auth = if tls.client_cert_auth { "need" } else { "none" };
    Ok(format!(
        "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
         ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
         ssl.trustStore.location={}\nssl.trustStore.type=PEM\n\
         ssl.clientAuth={auth}\n",
        keystore.display(),
        truststore.display()
    ))
}

impl Default for Options {
    fn default() -> Self {
        Options {
            tick_ms: 250,
            min_session_ms: 1000,
            max_session_ms: 60_000,
            extended_types: true,
            container_check_ms: 200,
            require_digest: false,
            sasl_users: Vec::new(),
            tls: None,
        }
    }
}

fn java(tls: bool) -> io::Result<(PathBuf, String)> {
    if !Path::new(JAR).is_file() {
        return Err(super::missing(Kind::ZooKeeper, JAR));
    }
    let java = super::which("java").ok_or_else(|| super::missing(Kind::ZooKeeper, "java"))?;
    // zookeeper.jar's manifest Class-Path names its dependencies; slf4j-simple
    // only turns the NOP logger into log lines.
    let mut classpath = JAR.to_owned();
    if Path::new(SLF4J_SIMPLE).is_file() {
        classpath.push(':');
        classpath.push_str(SLF4J_SIMPLE);
    }
    if tls {
        if !Path::new(NETTY_CODEC).is_file() {
            return Err(super::missing(Kind::ZooKeeper, NETTY_CODEC));
        }
        classpath.push(':');
        classpath.push_str(NETTY_CODEC);
    }
    Ok((java, classpath))
}

/// `zoo.cfg`; `tls` the lines of [`write_tls`], which make the
/// client port the secure one (and the only one).
fn config(
    options: &Options,
    data: &Path,
    client: u16,
    servers: &[(u16, u16)],
    tls: Option<String>,
) -> String {
    let port = match tls {
        Some(_) => "secureClientPort",
        None => "clientPort",
    };
    let mut cfg = format!(
        "tickTime={}\nminSessionTimeout={}\nmaxSessionTimeout={}\ndataDir={}\n\
         {port}={client}\n{port}Address=127.0.0.1\nmaxClientCnxns=0\n\
         admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,stat,mntr,conf,cons,wchc\n",
        options.tick_ms,
        options.min_session_ms,
        options.max_session_ms,
        data.display()
    );
    cfg.push_str(tls.as_deref().unwrap_or_default());
    if options.require_digest {
        cfg.push_str("enforce.auth.enabled=true\nenforce.auth.schemes=digest\n");
    }
    if !servers.is_empty() {
        // initLimit/syncLimit are in ticks: 10 s / 2.5 s at the default tick.
        cfg.push_str("initLimit=40\nsyncLimit=10\n");
        for (i, (quorum, election)) in servers.iter().enumerate() {
            cfg.push_str(&format!("server.{}=127.0.0.1:{quorum}:{election}\n", i + 1));
        }
    }
    cfg
}

fn spec(
    main_class: &'static str,
    options: &Options,
    client: u16,
    servers: &[(u16, u16)],
    myid: Option<usize>,
    stop_signal: Signal,
) -> io::Result<Spec> {
    let (java, classpath) = java(options.tls.is_some())?;
    let dir = Arc::new(super::data_dir(Kind::ZooKeeper)?);
    let tls = match &options.tls {
        Some(tls) => Some(write_tls(tls, dir.path())?),
        None => None,
    };
    let data = dir.path().join("data");
    fs::create_dir(&data)?;
    if let Some(id) = myid {
        fs::write(data.join("myid"), format!("{id}\n"))?;
    }
    let cfg = dir.path().join("zoo.cfg");
    fs::write(&cfg, config(options, &data, client, servers, tls))?;
    let log = dir.path().join("zookeeper.log");
    // System properties, not `zoo.cfg` lines: the server reads these two
    // from the JVM only.
    let mut properties = vec![
        format!(
            "-Dzookeeper.extendedTypesEnabled={}",
            options.extended_types
        ),
        format!(
            "-Dznode.container.checkIntervalMs={}",
            options.container_check_ms
        ),
    ];
    if !options.sasl_users.is_empty() {
        properties.extend(write_jaas(&options.sasl_users, dir.path())?);
    }
    let command = move || {
        let mut cmd = Command::new(&java);
        cmd.args(["-Xms32m", "-Xmx256m", "-XX:+UseSerialGC"])
            .args([
                "-Dzookeeper.admin.enableServer=false",
                "-Djava.net.preferIPv4Stack=true",
            ])
            .args(&properties)
            .args(["-cp", &classpath, main_class])
            .arg(&cfg);
        cmd
    };
    let secure = match (options.tls.is_some(), options.sasl_users.is_empty()) {
        (true, true) => " (TLS)",
        (true, false) => " (TLS, SASL)",
        (false, false) => " (SASL)",
        (false, true) => "",
    };
    let label = match myid {
        Some(id) => format!("zookeeper server.{id} on 127.0.0.1:{client}"),
        None => format!("zookeeper{secure} on 127.0.0.1:{client}"),
    };
    Ok(Spec {
        kind: Kind::ZooKeeper,
        label,
        addr: net::loopback(client),
        durable: true,
        dir,
        log,
        clock_file: None,
        launch: Launch {
            command: Box::new(command),
            stop_signal,
            stop_grace: Duration::from_secs(10),
            ready_within: Duration::from_secs(60),
            probe: None,
        },
    })
}

/// Starts a private standalone ZooKeeper on a free loopback port (admin
/// server off) and waits until `srvr` prints a `Mode:` line: it answers
/// `ruok` and accepts connections before it serves requests. With
/// [`Options::tls`], that port serves TLS only, and `srvr` is asked over TLS.
pub fn start(mut options: Options) -> io::Result<Store> {
    if options.tls.is_none() && env::ZOOKEEPER_TLS.get().is_some_and(|v| v == "1") {
        let ca = TestCa::new("distlock kit ZooKeeper CA");
        let Identity { cert, key } = ca.server();
        options.tls = Some(ClientTls::new(ca.pem(), cert, key));
    }
    let mut last = None;
    for _ in 0..3 {
        let client = net::free_port()?;
        let spec = spec(
            "org.apache.zookeeper.server.ZooKeeperServerMain",
            &options,
            client,
            &[],
            None,
            Signal::SIGTERM,
        )?;
        // The backend learns how late the server deletes expired TTL nodes.
        let mut query = format!("?container_check_interval={}ms", options.container_check_ms);
        let launched = match &options.tls {
            Some(tls) => {
                let ca = spec.dir.path().join(CA_FILE);
                query.push_str(&format!("&tls_ca={}", ca.display()));
                Store::launch_tls(spec, tls.probe(b"srvr", serves)?)
            }
            None => Store::launch(spec),
        };
        let launched = launched.map(|store| store.with_url_query(&query));
        match launched {
            Err(e) if net::port_clash(&e) => last = Some(e),
            other => return other,
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("zookeeper did not start")))
}

/// Starts a `size`-server ensemble on loopback and waits until every server
/// serves (one leader, the others followers). A port another process took
/// between its choice and the bind: again, on other ports (five tries).
pub fn start_ensemble(size: usize) -> io::Result<Cluster> {
    let mut last = None;
    for _ in 0..5 {
        match EnsemblePlan::new(size)?.start() {
            Err(e) if net::port_clash(&e) => last = Some(e),
            other => return other,
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("zookeeper ensemble did not start")))
}

/// The ports of an ensemble, chosen before it starts, so that a test can put
/// fault proxies on the links between members: with [`route`](Self::route),
/// member `from` reaches member `to`'s quorum port (where a follower talks
/// to its leader) through another address.
#[derive(Debug, Clone)]
pub struct EnsemblePlan {
    /// Client, quorum and election port of each member.
    ports: Vec<(u16, u16, u16)>,
    /// `(from, to)` → the port on 127.0.0.1 where `from` reaches `to`'s quorum port.
    routes: HashMap<(usize, usize), u16>,
}

impl EnsemblePlan {
    /// Free loopback ports for `size` members.
    pub fn new(size: usize) -> io::Result<EnsemblePlan> {
        let ports = (0..size)
            .map(|_| Ok((net::free_port()?, net::free_port()?, net::free_port()?)))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(EnsemblePlan {
            ports,
            routes: HashMap::new(),
        })
    }

    /// Where member `member` (0-based) listens for its followers.
    pub fn quorum_addr(&self, member: usize) -> SocketAddr {
        net::loopback(self.ports[member].1)
    }

    /// Member `from` reaches member `to`'s quorum port at `via` (on
    /// 127.0.0.1, say a `FaultProxy` in front of [`quorum_addr`](Self::quorum_addr)`(to)`).
    ///
    /// # Panics
    /// If `via` is not on 127.0.0.1 or a member does not exist.
    pub fn route(&mut self, from: usize, to: usize, via: SocketAddr) -> &mut Self {
        assert!(from < self.ports.len() && to < self.ports.len() && from != to);
        assert_eq!(via.ip(), net::loopback(0).ip(), "routes are on loopback");
        self.routes.insert((from, to), via.port());
        self
    }

    /// Starts the ensemble and waits until every server serves.
    pub fn start(&self) -> io::Result<Cluster> {
        // Plaintext: TLS (and `LOCK_TEST_ZOOKEEPER_TLS`) is for standalone servers.
        let options = Options::default();
        let handles: Vec<_> = (0..self.ports.len())
            .map(|i| {
                let servers: Vec<(u16, u16)> = (self.ports.iter().enumerate())
                    .map(|(j, &(_, quorum, election))| {
                        (*self.routes.get(&(i, j)).unwrap_or(&quorum), election)
                    })
                    .collect();
                let spec = spec(
                    "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                    &options,
                    self.ports[i].0,
                    &servers,
                    Some(i + 1),
                    Signal::SIGKILL,
                );
                std::thread::spawn(move || Store::launch(spec?))
            })
            .collect();
        Cluster::join("zookeeper ensemble", handles)
    }
}

/// Whether the server at `addr` is the ensemble leader (`srvr`: `Mode: leader`).
pub fn is_leader(addr: SocketAddr) -> io::Result<bool> {
    Ok(mode(addr)?.as_deref() == Some("leader"))
}

/// Whether a `srvr` reply says the server serves (it has a `Mode:` line).
pub(super) fn serves(reply: &[u8]) -> bool {
    String::from_utf8_lossy(reply).contains("Mode: ")
}

/// The server's `Mode:` (`standalone`, `leader`, `follower`), if it serves.
pub fn mode(addr: SocketAddr) -> io::Result<Option<String>> {
    let reply = net::exchange(addr, b"srvr", Duration::from_millis(500), |_| false)?;
    Ok(String::from_utf8_lossy(&reply)
        .lines()
        .find_map(|l| l.strip_prefix("Mode: ").map(|m| m.trim().to_owned())))
}

static SHARED: SharedSlot = SharedSlot::new();

/// The ZooKeeper of this test binary, or the server named by
/// `LOCK_TEST_ZOOKEEPER_URL` (`zk://host:port[,host:port][/root]`; the first
/// host is proxied and probed).
///
/// # Panics
/// When it cannot be started, with what to install.
pub fn shared() -> Arc<Store> {
    try_shared().unwrap_or_else(|e| panic!("zookeeper store unavailable: {e}"))
}

/// [`shared`] without the panic.
pub fn try_shared() -> io::Result<Arc<Store>> {
    super::shared_store(Kind::ZooKeeper, &SHARED, || start(Options::default()))
}

/// [`shared`], or `None` after a loud SKIP line when ZooKeeper is missing and
/// the run is explicitly partial (`LOCK_TEST_PARTIAL=1`, not CI).
pub fn shared_or_skip() -> Option<Arc<Store>> {
    super::shared_or_skip(Kind::ZooKeeper, try_shared)
}
