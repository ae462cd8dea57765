//! Prints the check script `vigia::store::limits_script` makes for one shape of limits, so
//! that `benches/lua-cpu.sh` (`SCRIPT=shaped`) can measure the script the service really
//! sends to Redis.
//!
//! Usage: `cargo run --release --example limits_lua -- s:10000:10000 f:60000:60000`
//! One argument per limit, `ALGORITHM:WINDOW_MS:RETAIN_MS`, the algorithm as check.lua
//! spells it (`s` sliding window, `f` fixed window, `t` token bucket). Every limit gets a
//! key of its own (no two share a sorted set).

use std::process::ExitCode;

use vigia::rules::Algorithm;
use vigia::store::limits_script::Shape;

fn limit(arg: &str) -> Result<(Algorithm, u64, u64), String> {
    let parts: Vec<&str> = arg.split(':').collect();
    let [letter, window, retain] = parts[..] else {
        return Err(format!("`{arg}`: expected ALGORITHM:WINDOW_MS:RETAIN_MS"));
    };
    let algorithm = match letter {
        "s" => Algorithm::SlidingWindow,
        "f" => Algorithm::FixedWindow,
        "t" => Algorithm::TokenBucket,
        other => return Err(format!("`{arg}`: algorithm `{other}` is not s, f or t")),
    };
    let ms = |v: &str| {
        v.parse::<u64>()
            .map_err(|e| format!("`{arg}`: `{v}` is not a number of milliseconds ({e})"))
    };
    Ok((algorithm, ms(window)?, ms(retain)?))
}

fn main() -> ExitCode {
    let limits: Result<Vec<_>, _> = std::env::args().skip(1).map(|a| limit(&a)).collect();
    let limits = match limits {
        Ok(l) => l,
        Err(e) => {
            eprintln!("limits_lua: {e}");
            return ExitCode::FAILURE;
        }
    };
    let keys: Vec<String> = (0..limits.len()).map(|i| format!("k{i}")).collect();
    let shape = Shape::of(
        limits
            .iter()
            .zip(&keys)
            .map(|(&(a, w, r), k)| (k.as_str(), a, w, 1, r)),
    );
    match shape {
        Some(shape) => {
            print!("{}", shape.lua());
            ExitCode::SUCCESS
        }
        None => {
            eprintln!(
                "limits_lua: {} limits; a shaped script takes at most {}",
                limits.len(),
                vigia::store::limits_script::MAX_LIMITS
            );
            ExitCode::FAILURE
        }
    }
}
