//! Durations in rule files: `500ms`, `10s`, `5m`, `1h`, `7d`.

/// Parses a rule-file duration into milliseconds. `None` when malformed or zero.
pub fn parse_duration_ms(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(mult).filter(|&ms| ms > 0)
}
