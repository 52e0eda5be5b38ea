//! `distlock inspect`: who holds a lock, a semaphore's permits or a
//! reader-writer lock (and a run-once job's last completed run, while its
//! window lasts), as text or as one JSON object a script can read.

use std::process::ExitCode;
use std::time::Duration;

use distlock::backend::Kind;
use distlock::{Holder, LastRun, LockName, Locker};

use super::exit::Failure;

pub(super) async fn inspect(
    locker: &Locker,
    name: &str,
    json: bool,
    kind: Kind,
) -> Result<ExitCode, Failure> {
    let name = LockName::new(name)?;
    let holders: Vec<Holder> = locker.backend().holders(&name, kind).await?;
    let last = if kind != Kind::Lock {
        None
    } else {
        // A name too long to have a record has none.
        match locker.job(&name)?.last_run().await {
            Err(distlock::LockError::InvalidConfig { .. }) => None,
            read => read?,
        }
    };
    if json {
        println!("{}", to_json(&name, kind, &holders, last.as_ref()));
    } else if holders.is_empty() {
        println!("{name}: free");
    } else {
        for h in &holders {
            println!(
                "{name}: held{}{}, fence={}, owner={}, label={}, expires_in={}",
                h.slot.map_or(String::new(), |s| format!(" (slot {s})")),
                h.access.map_or(String::new(), |a| format!(" ({a})")),
                h.fence,
                h.owner.map_or("?".into(), |o| o.to_string()),
                h.label.as_ref().map_or("?".into(), |l| l.to_string()),
                h.expires_in
                    .map_or("session".into(), |d| humantime::format_duration(round_ms(
                        d
                    ))
                    .to_string())
            );
        }
    }
    if let (Some(last), false) = (&last, json) {
        println!("{name}: last run {}", describe_run(last));
    }
    Ok(ExitCode::SUCCESS)
}

/// A job's last completed run in words: `fence=12, took 3s 400ms, ended
/// 2026-12-06T09:13:07Z (its node's clock), by host:42, window ends in 54m`.
pub(super) fn describe_run(last: &LastRun) -> String {
    format!(
        "fence={}, took {}, ended {} (its node's clock), by {}{}",
        last.fence,
        humantime::format_duration(round_ms(last.took)),
        humantime::format_rfc3339_seconds(last.ended_at),
        last.by,
        last.window_left.map_or(String::new(), |d| format!(
            ", window ends in {}",
            humantime::format_duration(round_ms(d))
        ))
    )
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis().try_into().unwrap_or(u64::MAX))
}

/// `{"name":..,"held":..,"fence":..,"owner":..,"label":..,"expires_in_ms":..}`
/// (with `"last_run":{"fence":..,"took_ms":..,"ended_ms":..,"by":..,"window_left_ms":..}`
/// while a job's record lasts), for a semaphore
/// `{"name":..,"permits":[{"slot":..,...}]}`, for a reader-writer lock
/// `{"name":..,"holders":[{"access":"read",...}]}`.
fn to_json(name: &LockName, kind: Kind, holders: &[Holder], last: Option<&LastRun>) -> String {
    let holder = |h: &Holder| {
        let mut fields = Vec::new();
        if let Some(slot) = h.slot {
            fields.push(format!("\"slot\":{slot}"));
        }
        if let Some(access) = h.access {
            fields.push(format!("\"access\":\"{access}\""));
        }
        fields.push(format!("\"fence\":{}", h.fence));
        fields.push(format!(
            "\"owner\":{}",
            h.owner
                .map_or("null".into(), |o| json_string(&o.to_string()))
        ));
        fields.push(format!(
            "\"label\":{}",
            h.label
                .as_ref()
                .map_or("null".into(), |l| json_string(l.as_str()))
        ));
        fields.push(format!(
            "\"expires_in_ms\":{}",
            h.expires_in
                .map_or("null".into(), |d| d.as_millis().to_string())
        ));
        fields.join(",")
    };
    if kind != Kind::Lock {
        let list: Vec<String> = holders
            .iter()
            .map(|h| format!("{{{}}}", holder(h)))
            .collect();
        let field = if kind == Kind::Semaphore {
            "permits"
        } else {
            "holders"
        };
        format!(
            "{{\"name\":{},\"{field}\":[{}]}}",
            json_string(name.as_str()),
            list.join(",")
        )
    } else {
        let last = last.map_or(String::new(), |l| {
            format!(
                ",\"last_run\":{{\"fence\":{},\"took_ms\":{},\"ended_ms\":{},\"by\":{},\"window_left_ms\":{}}}",
                l.fence,
                l.took.as_millis(),
                l.ended_at
                    .duration_since(std::time::SystemTime::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_millis(),
                json_string(&l.by),
                l.window_left
                    .map_or("null".into(), |d| d.as_millis().to_string())
            )
        });
        match holders.first() {
            Some(h) => format!(
                "{{\"name\":{},\"held\":true,{}{last}}}",
                json_string(name.as_str()),
                holder(h)
            ),
            None => format!(
                "{{\"name\":{},\"held\":false{last}}}",
                json_string(name.as_str())
            ),
        }
    }
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock::FencingToken;

    #[test]
    fn json_escapes_and_reports_free_and_held() {
        assert_eq!(json_string("a\"b\\c\u{1}"), "\"a\\\"b\\\\c\\u0001\"");
        let name = LockName::new("n").unwrap();
        assert_eq!(
            to_json(&name, Kind::Lock, &[], None),
            "{\"name\":\"n\",\"held\":false}"
        );
        let h = Holder::new(
            FencingToken::new(7).unwrap(),
            None,
            Some(Duration::from_millis(1500)),
        );
        assert_eq!(
            to_json(&name, Kind::Lock, std::slice::from_ref(&h), None),
            "{\"name\":\"n\",\"held\":true,\"fence\":7,\"owner\":null,\"label\":null,\"expires_in_ms\":1500}"
        );
        let reader = h.with_access(distlock::Access::Read);
        assert_eq!(
            to_json(&name, Kind::ReadWrite, &[reader], None),
            "{\"name\":\"n\",\"holders\":[{\"access\":\"read\",\"fence\":7,\"owner\":null,\"label\":null,\"expires_in_ms\":1500}]}"
        );
    }
}
