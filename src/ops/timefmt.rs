//! Times as operators type and read them: RFC 3339 or relative (`90s`, `30m`, `2h`,
//! `7d`, meaning that long before now) in; RFC 3339 and short ages (`3m`, `2h5m`) out.

use chrono::{DateTime, SecondsFormat, Utc};

/// Parses `text` as an RFC 3339 time or a relative one, giving unix milliseconds.
pub fn parse_time(text: &str, now_ms: i64) -> Result<i64, String> {
    let t = text.trim();
    if let Ok(dt) = DateTime::parse_from_rfc3339(t) {
        return Ok(dt.timestamp_millis());
    }
    let unit_at = t
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| bad(text))?;
    let (n, unit) = t.split_at(unit_at);
    let n: i64 = n.parse().map_err(|_| bad(text))?;
    let unit_ms: i64 = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad(text)),
    };
    Ok(now_ms - n.saturating_mul(unit_ms))
}

/// The error message for an unparsable time.
fn bad(text: &str) -> String {
    format!("{text:?} is neither RFC 3339 (2026-11-30T12:00:00Z) nor relative (30m, 2h, 7d)")
}

/// Unix milliseconds as RFC 3339 UTC with seconds (`2026-11-30T12:00:00Z`).
pub fn rfc3339(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|d| d.to_rfc3339_opts(SecondsFormat::Secs, true))
        .unwrap_or_else(|| ms.to_string())
}

/// A short duration: `45s`, `12m`, `3h20m`, `2d4h`; negative durations read `-…`.
pub fn duration(ms: i64) -> String {
    if ms < 0 {
        return format!("-{}", duration(-ms));
    }
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// Current time, unix milliseconds.
pub fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_absolute_and_relative() {
        let now = 1_800_000_000_000;
        assert_eq!(parse_time("2h", now), Ok(now - 7_200_000));
        assert_eq!(parse_time("30m", now), Ok(now - 1_800_000));
        assert_eq!(parse_time("7d", now), Ok(now - 604_800_000));
        assert_eq!(parse_time("90s", now), Ok(now - 90_000));
        assert_eq!(
            parse_time("2026-11-30T12:00:00Z", now),
            Ok(1_796_040_000_000)
        );
        assert_eq!(
            parse_time("2026-11-30T13:00:00+01:00", now),
            Ok(1_796_040_000_000)
        );
        assert!(parse_time("yesterday", now).is_err());
        assert!(parse_time("2w", now).is_err());
        assert!(parse_time("h", now).is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(rfc3339(1_796_040_000_000), "2026-11-30T12:00:00Z");
        assert_eq!(duration(45_000), "45s");
        assert_eq!(duration(12 * 60_000), "12m");
        assert_eq!(duration(3 * 3_600_000 + 20 * 60_000), "3h20m");
        assert_eq!(duration(2 * 86_400_000 + 4 * 3_600_000), "2d4h");
        assert_eq!(duration(-5_000), "-5s");
    }
}
