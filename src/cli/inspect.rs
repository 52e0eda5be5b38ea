//! `distlock inspect`: who holds a lock or a semaphore's permits, as text
//! or as one JSON object a script can read.

use std::process::ExitCode;
use std::time::Duration;

use distlock::backend::Kind;
use distlock::{Holder, LockName, Locker};

use super::exit::Failure;

pub(super) async fn inspect(
    locker: &Locker,
    name: &str,
    json: bool,
    permits: bool,
) -> Result<ExitCode, Failure> {
    let name = LockName::new(name)?;
    let holders: Vec<Holder> = if permits {
        locker.backend().holders(&name, Kind::Semaphore).await?
    } else {
        locker.inspect(&name).await?.into_iter().collect()
    };
    if json {
        println!("{}", to_json(&name, permits, &holders));
    } else if holders.is_empty() {
        println!("{name}: free");
    } else {
        for h in &holders {
            println!(
                "{name}: held{}, fence={}, owner={}, label={}, expires_in={}",
                h.slot.map_or(String::new(), |s| format!(" (slot {s})")),
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
    Ok(ExitCode::SUCCESS)
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis().try_into().unwrap_or(u64::MAX))
}

/// `{"name":..,"held":..,"fence":..,"owner":..,"label":..,"expires_in_ms":..}`,
/// or for a semaphore `{"name":..,"permits":[{"slot":..,...}]}`.
fn to_json(name: &LockName, permits: bool, holders: &[Holder]) -> String {
    let holder = |h: &Holder| {
        let mut fields = Vec::new();
        if let Some(slot) = h.slot {
            fields.push(format!("\"slot\":{slot}"));
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
    if permits {
        let list: Vec<String> = holders
            .iter()
            .map(|h| format!("{{{}}}", holder(h)))
            .collect();
        format!(
            "{{\"name\":{},\"permits\":[{}]}}",
            json_string(name.as_str()),
            list.join(",")
        )
    } else {
        match holders.first() {
            Some(h) => format!(
                "{{\"name\":{},\"held\":true,{}}}",
                json_string(name.as_str()),
                holder(h)
            ),
            None => format!("{{\"name\":{},\"held\":false}}", json_string(name.as_str())),
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
            to_json(&name, false, &[]),
            "{\"name\":\"n\",\"held\":false}"
        );
        let h = Holder::new(
            FencingToken::new(7).unwrap(),
            None,
            Some(Duration::from_millis(1500)),
        );
        assert_eq!(
            to_json(&name, false, &[h]),
            "{\"name\":\"n\",\"held\":true,\"fence\":7,\"owner\":null,\"label\":null,\"expires_in_ms\":1500}"
        );
    }
}
