//! The fault cases must bite too. A flaw only a fault proxy reveals (a grant
//! left behind by a lost acquire reply) is wrapped
//! (`lock_conformance::broken`) around a deliberately minimal Redis backend
//! written below, over the real `redis-server` the harness launches (or the
//! one `LOCK_TEST_REDIS_URL` names), so the suite's own tests need no
//! adapter; the minimal backend without the flaw passes the same cases.

use std::io;
use std::time::Duration;

use lock_conformance::StoreFactory;
use lock_conformance::broken::{BrokenFactory, Flaw};
use lock_conformance::kit::stores;
use lock_conformance::{Factory, Outcome, Report, run_cases};
use lockcore::backend::{Kind, LockRequest, async_trait};
use lockcore::{
    Attempt, Capabilities, ExpiryClock, FencingToken, Holder, Lease, LockBackend, LockError,
    LockName, OwnerToken, ReleaseOutcome,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const BACKEND: &str = "mini-redis";

/// How long one call may take before it counts as unanswered.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// A minimal Redis lock backend: each operation is one `EVAL` (atomic), sent
/// on a fresh connection and bounded by `CALL_TIMEOUT`, with nothing else on
/// the wire (no handshake to lose). No queue, no notifications: just what
/// the cases run here need.
#[derive(Debug, Clone)]
struct MiniRedis {
    addr: String,
}

/// One RESP reply (what the scripts below return).
#[derive(Debug)]
enum Reply {
    Int(i64),
    Bulk(Option<String>),
    Array(Vec<Reply>),
}

const ACQUIRE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return {0, redis.call('PTTL', KEYS[1])} end
local fence = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. fence, 'PX', ARGV[2])
return {1, fence}";

const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0";

const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0";

const INSPECT: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then return {} end
return {v, redis.call('PTTL', KEYS[1])}";

const EVICT: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then return {} end
if ARGV[1] ~= '' and string.match(v, ':(%d+)$') ~= ARGV[1] then return {} end
local left = redis.call('PTTL', KEYS[1])
redis.call('DEL', KEYS[1])
return {v, left}";

fn keys(name: &LockName) -> (String, String) {
    (
        format!("mini-lock:{{{name}}}"),
        format!("mini-fence:{{{name}}}"),
    )
}

fn value(lease: &Lease) -> String {
    format!("{}:{}", lease.owner().encode(), lease.fence())
}

fn holder(value: &str, left_ms: i64) -> Result<Holder, LockError> {
    let (owner, fence) = value
        .rsplit_once(':')
        .and_then(|(owner, fence)| {
            Some((
                OwnerToken::decode(owner)?,
                FencingToken::new(fence.parse().ok()?)?,
            ))
        })
        .ok_or_else(|| LockError::store(BACKEND, format!("unexpected value {value:?}")))?;
    let left = u64::try_from(left_ms).ok().map(Duration::from_millis);
    Ok(Holder::new(fence, Some(owner), left))
}

impl Reply {
    fn int(&self) -> Result<i64, LockError> {
        match self {
            Reply::Int(n) => Ok(*n),
            other => Err(LockError::store(
                BACKEND,
                format!("expected an integer: {other:?}"),
            )),
        }
    }

    /// A `{value, ms left}` pair, or nothing for an empty array.
    fn holder(&self) -> Result<Option<Holder>, LockError> {
        match self {
            Reply::Array(items) if items.is_empty() => Ok(None),
            Reply::Array(items) => match &items[..] {
                [Reply::Bulk(Some(value)), Reply::Int(left)] => holder(value, *left).map(Some),
                _ => Err(LockError::store(
                    BACKEND,
                    format!("unexpected reply {items:?}"),
                )),
            },
            other => Err(LockError::store(
                BACKEND,
                format!("unexpected reply {other:?}"),
            )),
        }
    }
}

async fn read_line(reader: &mut BufReader<TcpStream>) -> io::Result<String> {
    let mut line = String::new();
    reader.read_line(&mut line).await?;
    if !line.ends_with("\r\n") {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

fn number(text: &str) -> io::Result<i64> {
    text.parse()
        .map_err(|_| io::Error::other(format!("not a number: {text:?}")))
}

/// Reads an integer, a bulk string, or an error, as the scripts return them.
async fn read_scalar(reader: &mut BufReader<TcpStream>, line: String) -> io::Result<Reply> {
    match line.split_at(1) {
        (":", n) => Ok(Reply::Int(number(n)?)),
        ("$", "-1") => Ok(Reply::Bulk(None)),
        ("$", len) => {
            let mut bytes = vec![0; usize::try_from(number(len)?).unwrap_or(0) + 2];
            reader.read_exact(&mut bytes).await?;
            bytes.truncate(bytes.len() - 2);
            Ok(Reply::Bulk(Some(
                String::from_utf8_lossy(&bytes).into_owned(),
            )))
        }
        ("-", error) => Err(io::Error::other(format!("Redis error: {error}"))),
        _ => Err(io::Error::other(format!("unexpected reply line {line:?}"))),
    }
}

impl MiniRedis {
    async fn connect(url: String) -> Result<Self, LockError> {
        let addr = url
            .strip_prefix("redis://")
            .ok_or_else(|| LockError::config(format!("not a redis:// URL: {url}")))?;
        Ok(MiniRedis {
            addr: addr.trim_end_matches('/').to_owned(),
        })
    }

    /// `EVAL script keys args` on a fresh connection.
    async fn eval(&self, script: &str, keys: &[&str], args: &[&str]) -> Result<Reply, LockError> {
        let numkeys = keys.len().to_string();
        let words: Vec<&str> = ["EVAL", script, numkeys.as_str()]
            .into_iter()
            .chain(keys.iter().copied())
            .chain(args.iter().copied())
            .collect();
        let mut request = format!("*{}\r\n", words.len());
        for word in words {
            request.push_str(&format!("${}\r\n{word}\r\n", word.len()));
        }
        let call = async {
            let mut stream = TcpStream::connect(&self.addr).await?;
            stream.write_all(request.as_bytes()).await?;
            let mut reader = BufReader::new(stream);
            let line = read_line(&mut reader).await?;
            match line.strip_prefix('*') {
                Some(n) => {
                    let mut items = Vec::new();
                    for _ in 0..number(n)?.max(0) {
                        let line = read_line(&mut reader).await?;
                        items.push(read_scalar(&mut reader, line).await?);
                    }
                    Ok(Reply::Array(items))
                }
                None => read_scalar(&mut reader, line).await,
            }
        };
        match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => Err(LockError::unavailable(BACKEND, e)),
            Err(_) => Err(LockError::unavailable(
                BACKEND,
                format!("no answer within {CALL_TIMEOUT:?}"),
            )),
        }
    }
}

#[async_trait]
impl LockBackend for MiniRedis {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(BACKEND)
            .expiry_clock(ExpiryClock::StoreWallClock)
            .expiry_slack(Duration::from_millis(1))
    }

    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        if request.kind() != Kind::Lock {
            return Err(request.kind().unsupported(BACKEND));
        }
        let (name, ttl) = (request.name(), request.ttl());
        let (lock, fences) = keys(name);
        let owner = OwnerToken::new();
        let (owner_text, ms) = (owner.encode(), ttl.as_millis_ceil().to_string());
        let sent = request.now();
        let reply = self
            .eval(ACQUIRE, &[&lock, &fences], &[&owner_text, &ms])
            .await?;
        let (granted, n) = match &reply {
            Reply::Array(items) if items.len() == 2 => (items[0].int()?, items[1].int()?),
            other => {
                return Err(LockError::store(
                    BACKEND,
                    format!("unexpected reply {other:?}"),
                ));
            }
        };
        if granted == 0 {
            let expires_in = u64::try_from(n).ok().map(Duration::from_millis);
            return Ok(Attempt::Held { expires_in });
        }
        let fence = u64::try_from(n)
            .ok()
            .and_then(FencingToken::new)
            .ok_or_else(|| LockError::store(BACKEND, format!("fence {n}")))?;
        Ok(Attempt::Acquired(Lease::granted(
            request, owner, fence, sent,
        )))
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        let ms = lease.ttl().as_millis_ceil().to_string();
        let sent = lease.now();
        let reply = self
            .eval(RENEW, &[&keys(lease.name()).0], &[&value(lease), &ms])
            .await?;
        match reply.int()? {
            1 => Ok(lease.renewed(sent)),
            _ => Err(LockError::NotHeld {
                name: lease.name().clone(),
            }),
        }
    }

    /// One script per lease: this minimal backend has no batch.
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        let mut renewed = Vec::with_capacity(leases.len());
        for lease in leases {
            renewed.push(self.renew(lease).await);
        }
        renewed
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let reply = self
            .eval(RELEASE, &[&keys(lease.name()).0], &[&value(lease)])
            .await?;
        Ok(match reply.int()? {
            1 => ReleaseOutcome::Released,
            _ => ReleaseOutcome::NotHeld,
        })
    }

    async fn holders(&self, name: &LockName, kind: Kind) -> Result<Vec<Holder>, LockError> {
        if kind != Kind::Lock {
            return Err(kind.unsupported(BACKEND));
        }
        let holder = self.eval(INSPECT, &[&keys(name).0], &[]).await?.holder()?;
        Ok(holder.into_iter().collect())
    }

    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        let expected = expected.map(|f| f.to_string()).unwrap_or_default();
        self.eval(EVICT, &[&keys(name).0], &[&expected])
            .await?
            .holder()
    }
}

fn factory() -> StoreFactory {
    StoreFactory::new(stores::redis::shared(), MiniRedis::connect)
}

/// The fault cases the minimal backend must pass.
const CASES: &[&str] = &[
    "partitioned_holder_is_fenced_out",
    "slow_renewal_counts_as_lost",
    "reset_mid_hold_keeps_or_reports",
    "lost_acquire_reply_leaves_no_phantom",
    "late_grant_counts_from_the_waiters_request",
    "dropped_attempt_leaves_no_phantom",
];

async fn run(factory: impl Factory, cases: &[&str]) -> Report {
    let report = run_cases(factory, |c| cases.contains(&c.name)).await;
    assert_eq!(report.cases.len(), cases.len(), "unknown case in {cases:?}");
    println!("{report}");
    report
}

/// Runs the cases of `expected` with `flaw` and checks each fails, saying
/// the text paired with it.
async fn must_fail_saying(flaw: Flaw, expected: &[(&str, &str)]) {
    let names: Vec<&str> = expected.iter().map(|(name, _)| *name).collect();
    run(BrokenFactory::new(factory(), flaw), &names)
        .await
        .assert_failed_saying(expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_minimal_backend_passes_the_fault_cases() {
    let report = run(factory(), CASES).await;
    assert!(
        report.cases.iter().all(|c| c.result == Ok(Outcome::Passed)),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_phantom_left_by_a_lost_acquire_reply_is_caught() {
    must_fail_saying(
        Flaw::LongGrantUntilAnswered,
        &[(
            "lost_acquire_reply_leaves_no_phantom",
            "after an acquire whose reply was lost did not happen",
        )],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_before_a_silent_holders_deadline_is_caught() {
    must_fail_saying(
        Flaw::ShortStoreTtl,
        &[
            (
                "partitioned_holder_is_fenced_out",
                "before the silent holder's local deadline",
            ),
            (
                "slow_renewal_counts_as_lost",
                "before the silent holder's local deadline",
            ),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_served_late_is_caught() {
    must_fail_saying(
        Flaw::LateWaiter,
        &[
            (
                "partitioned_holder_is_fenced_out",
                "L1: C (waiting in acquire) got",
            ),
            (
                "slow_renewal_counts_as_lost",
                "L1: C (waiting in acquire) got",
            ),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_freed_with_its_connection_before_the_holder_knows_is_caught() {
    must_fail_saying(
        Flaw::FreedWithConnection,
        &[(
            "reset_mid_hold_keeps_or_reports",
            "while A's guard still counted on it",
        )],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_kept_alive_after_its_caller_was_dropped_is_caught() {
    must_fail_saying(
        Flaw::KeepsDroppedGrants,
        &[(
            "dropped_attempt_leaves_no_phantom",
            "the lock free after an attempt dropped in flight",
        )],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_counted_from_its_late_reply_is_caught() {
    must_fail_saying(
        Flaw::LeaseFromReply,
        &[(
            "late_grant_counts_from_the_waiters_request",
            "its lease counts from the message",
        )],
    )
    .await;
}
