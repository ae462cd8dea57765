//! Check scripts made for one shape of limits: the Lua that `lua/check.lua` would run for a
//! check, with each limit's algorithm, window and retain written into the text and its
//! branch of `lua/limits.lua` laid out straight, limit after limit.
//!
//! Why: check.lua is general. Before it touches a key it defines limits.lua's helpers
//! (closures and tables made on every call), parses five arguments per limit into a
//! 19-field table (`tonumber` is glibc's strtod) and loops over the limits through
//! dispatch on the algorithm. For the bench scene that is about a third of the Redis
//! instructions of a check (`benches/lua-cpu.sh`); a script made for the shape runs only
//! the Redis calls and the arithmetic, and Redis's CPU per check bounds a node's rate.
//!
//! A shape is what the rules fix: per limit its algorithm, window, retain and whether its
//! key is an earlier limit's (sliding limits over the same dimensions share a ZSET). The
//! max stays an argument: a CIDR override changes it per request, and shapes must stay as
//! few as the rule files make them (each is a script in Redis's script cache). A check
//! with more than [`MAX_LIMITS`] limits runs check.lua.
//!
//! The arithmetic is limits.lua's, line for line; `tests/limits_script.rs` runs random
//! checks across window edges through both and compares every answer and every key.
//! Layout (KEYS, ARGV): check.lua's header, except that ARGV[7] is the request record's
//! entries for the fixed windows and buckets (what limits.lua builds from the tags),
//! ARGV[7 + i] is limit i's max, and nothing else per limit is sent. The reply is check.lua's in one bulk string:
//! `allow|c1|x1|r1|c2|…` or `deny|…` (count, exceeded 0/1, retry ms per limit), or
//! `dup|<request id>` or `held|<request id>`; `store::redis::parse_check_reply` reads both
//! forms.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;

use redis::{Cmd, Script};
use smallvec::SmallVec;

use super::redis::{record_entries, CheckCall, CheckLimit, CHECK_LUA};
use super::EXPIRY_MARGIN_MS;
use crate::rules::Algorithm;

/// The most limits a generated script takes (Lua allows 200 locals per function; each
/// limit uses up to 8).
pub const MAX_LIMITS: usize = 16;

/// Distinct shapes kept; each is a few kB of text. Rule files make a handful per scene.
const CACHE_SHAPES: usize = 256;

/// One limit of a [`Shape`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShapeLimit {
    pub algorithm: Algorithm,
    pub window_ms: u64,
    /// Sliding windows: the longest window sharing the key (see `LimitOp::retain_ms`).
    pub retain_ms: u64,
    /// The index of the first earlier limit with the same key: that limit writes it.
    pub same_key_as: Option<u8>,
}

/// What a generated script is made for (see the module header).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shape(pub SmallVec<[ShapeLimit; INLINE_LIMITS]>);

/// Limits a shape holds without a heap allocation: a shape is made for every check, to
/// find its script.
const INLINE_LIMITS: usize = 8;

impl Shape {
    /// The shape of `limits`, as [`CheckCall::command`] would send them; `None` with more
    /// than [`MAX_LIMITS`].
    pub fn of<'l>(limits: impl ExactSizeIterator<Item = CheckLimit<'l>> + Clone) -> Option<Shape> {
        if limits.len() > MAX_LIMITS {
            return None;
        }
        let keys: SmallVec<[&str; MAX_LIMITS]> = limits.clone().map(|(key, ..)| key).collect();
        let shape = limits
            .enumerate()
            .map(|(i, (key, algorithm, window_ms, _, retain_ms))| {
                let window_ms = window_ms.max(1);
                ShapeLimit {
                    algorithm,
                    window_ms,
                    retain_ms: retain_ms.max(window_ms),
                    // i < MAX_LIMITS, so the index fits.
                    same_key_as: keys[..i].iter().position(|k| *k == key).map(|j| j as u8),
                }
            })
            .collect();
        Some(Shape(shape))
    }

    /// The Lua text of this shape's check script.
    pub fn lua(&self) -> String {
        Lua::new(self).text()
    }
}

/// The script for a check's limits: the one made for their shape (made on first use and
/// kept, bounded), or check.lua for a shape too big for one. Redis learns a shape's script
/// on its first EVALSHA (NOSCRIPT, then a load: `RedisLink::eval`).
pub struct LimitScripts {
    check_lua: Arc<Script>,
    cache: quick_cache::sync::Cache<Shape, Arc<Script>>,
}

impl Default for LimitScripts {
    fn default() -> Self {
        LimitScripts {
            check_lua: Arc::new(Script::new(CHECK_LUA)),
            cache: quick_cache::sync::Cache::new(CACHE_SHAPES),
        }
    }
}

impl std::fmt::Debug for LimitScripts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimitScripts")
            .field("shapes", &self.cache.len())
            .finish()
    }
}

impl LimitScripts {
    /// check.lua, the script for any shape (loaded at start).
    pub fn check_lua(&self) -> &Script {
        &self.check_lua
    }

    /// The script for `limits` and its EVALSHA for `call`.
    pub fn command<'l>(
        &self,
        call: &CheckCall<'_>,
        limits: impl ExactSizeIterator<Item = CheckLimit<'l>> + Clone,
    ) -> (Arc<Script>, Cmd) {
        let Some(shape) = Shape::of(limits.clone()) else {
            let cmd = call.command(self.check_lua.get_hash(), limits);
            return (self.check_lua.clone(), cmd);
        };
        let made: Result<_, Infallible> = self
            .cache
            .get_or_insert_with(&shape, || Ok(Arc::new(Script::new(&shape.lua()))));
        let script = match made {
            Ok(script) => script,
            Err(never) => match never {},
        };
        let cmd = command(call, script.get_hash(), limits);
        (script, cmd)
    }
}

/// The EVALSHA of a generated script (its SHA1 `sha`): check.lua's keys and fixed
/// arguments, the record's entries (`store::redis::record_entries`: every limit a shaped
/// script gets applies), then each limit's max.
pub fn command<'l>(
    call: &CheckCall<'_>,
    sha: &str,
    limits: impl ExactSizeIterator<Item = CheckLimit<'l>> + Clone,
) -> Cmd {
    let mut cmd = call.head(sha, limits.clone(), 1 + limits.len());
    let mut entries = record_entries(limits.clone());
    if let Some(stamp) = call.stamp {
        // The shaped script appends ARGV[7] to the record as it is: the stamp rides on it.
        let _ = write!(entries, "{stamp}");
    }
    cmd.arg(entries);
    for (_, _, _, max, _) in limits {
        cmd.arg(max);
    }
    cmd
}

/// Writes one shape's script. Limit i's locals end in i: `k` key, `m` max, `c` count
/// before this request, `a` count after it, `x` exceeded (1/0), `r` retry ms; fixed
/// windows add `s` start and `f` fresh, buckets `t` tokens left now.
struct Lua<'s> {
    shape: &'s Shape,
    out: String,
}

// `write!` into a String cannot fail; the results are discarded with `let _`.
impl<'s> Lua<'s> {
    fn new(shape: &'s Shape) -> Self {
        Lua {
            shape,
            out: String::with_capacity(1024 + 1024 * shape.0.len()),
        }
    }

    fn text(mut self) -> String {
        self.head();
        for i in 1..=self.shape.0.len() {
            self.evaluate(i);
        }
        self.deny_and_dry_run();
        for i in 1..=self.shape.0.len() {
            self.record(i);
        }
        self.record_and_reply();
        self.out
    }

    fn limit(&self, i: usize) -> ShapeLimit {
        self.shape.0[i - 1]
    }

    fn head(&mut self) {
        let shape = self
            .shape
            .0
            .iter()
            .map(|l| {
                format!(
                    "{}:{}:{}{}",
                    super::redis::algo_code(l.algorithm),
                    l.window_ms,
                    l.retain_ms,
                    l.same_key_as
                        .map(|j| format!("={}", j + 1))
                        .unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join(" ");
        let _ = writeln!(
            self.out,
            "-- vigia check script for the limits {shape} (src/store/limits_script.rs):\n\
             -- lua/check.lua for this shape, without its parsing and dispatch.\n\
             local rid = ARGV[1]\n\
             local rep = ARGV[3]\n\
             local now\n\
             if ARGV[5] == '' then\n  \
               local t = redis.call('TIME')\n  \
               now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n\
             else\n  \
               now = tonumber(ARGV[5])\n  \
               if now == nil then return redis.error_reply('limits script: now (ARGV[5]) is not a number') end\n\
             end\n\
             if rep ~= '' then\n  \
               local g = math.floor(now / math.max(tonumber(ARGV[4]) or 0, 1))\n  \
               local this, last = KEYS[1] .. ':' .. string.format('%d', g), KEYS[1] .. ':' .. string.format('%d', g - 1)\n  \
               local function rec(id) return redis.call('HGET', this, id) or redis.call('HGET', last, id) end\n  \
               local function dup(id)\n    \
                 local v = rec(id)\n    \
                 if v and string.find(v, '%.%d+$') then return 'held|' .. id end\n    \
                 return 'dup|' .. id\n  \
               end\n  \
               if (rep == 'r' or rep == 'ri') and rec(rid) then return dup(rid) end\n  \
               if rep == 'i' or rep == 'ri' then\n    \
                 local first = redis.call('HGET', this, ARGV[6]) or redis.call('HGET', last, ARGV[6])\n    \
                 if first then return dup(first) end\n  \
               end\n\
             end"
        );
    }

    fn evaluate(&mut self, i: usize) {
        let l = self.limit(i);
        let w = l.window_ms;
        let _ = writeln!(
            self.out,
            "local k{i} = KEYS[{key}]\nlocal m{i} = tonumber(ARGV[{arg}])\nlocal x{i}, r{i} = 0, 0",
            key = 1 + i,
            arg = 7 + i
        );
        match l.algorithm {
            Algorithm::SlidingWindow => {
                let _ = writeln!(
                    self.out,
                    "local lo{i} = '(' .. string.format('%d', now - {w})\n\
                     local c{i} = redis.call('ZCOUNT', k{i}, lo{i}, '+inf')\n\
                     if c{i} + 1 > m{i} then\n  \
                       x{i} = 1\n  \
                       local o = redis.call('ZRANGEBYSCORE', k{i}, lo{i}, '+inf', 'WITHSCORES', 'LIMIT', math.max(c{i} - m{i}, 0), 1)\n  \
                       if o[2] then r{i} = math.max(tonumber(o[2]) + {w} - now, 1) else r{i} = {w} end\n\
                     end\n\
                     local a{i} = c{i} + 1"
                );
            }
            Algorithm::FixedWindow => {
                let _ = writeln!(
                    self.out,
                    "local s{i} = now - (now % {w})\n\
                     local h{i} = redis.call('HMGET', k{i}, 's', 'c')\n\
                     local c{i}, f{i} = 0, true\n\
                     if h{i}[1] and tonumber(h{i}[1]) == s{i} then c{i} = tonumber(h{i}[2]) or 0; f{i} = false end\n\
                     if c{i} + 1 > m{i} then x{i} = 1; r{i} = math.max(s{i} + {w} - now, 1) end\n\
                     local a{i} = c{i} + 1"
                );
            }
            Algorithm::TokenBucket => {
                let _ = writeln!(
                    self.out,
                    "local h{i} = redis.call('HMGET', k{i}, 'tk', 'ts')\n\
                     local t{i} = m{i}\n\
                     if h{i}[1] and h{i}[2] then\n  \
                       t{i} = math.min(m{i}, tonumber(h{i}[1]) + math.max(now - tonumber(h{i}[2]), 0) * m{i} / {w})\n\
                     end\n\
                     local c{i} = math.max(math.ceil(m{i} - t{i} - 1e-9), 0)\n\
                     if m{i} <= 0 then x{i} = 1; r{i} = {w}\n\
                     elseif t{i} < 1 - 1e-9 then x{i} = 1; r{i} = math.max(math.ceil((1 - t{i}) * {w} / m{i} - 1e-9), 1) end\n\
                     local a{i} = math.max(math.ceil(m{i} - (t{i} - 1) - 1e-9), 0)"
                );
            }
        }
    }

    /// `kind|count|exceeded|retry|…` with the counts `c` (before) or `a` (after): one bulk
    /// string, not check.lua's array of 3 + 3n values: the client parses one
    /// value instead of sixteen (redis-rs's RESP parser was ~9 % of a Redis-mode check's
    /// service CPU), and Redis writes one. `%d` truncates as Redis does a Lua number it
    /// turns into an integer reply.
    fn reply(&self, kind: &str, count: char) -> String {
        let n = self.shape.0.len();
        if n == 0 {
            return format!("'{kind}'");
        }
        let mut format = kind.to_owned();
        let mut values = Vec::with_capacity(3 * n);
        for i in 1..=n {
            format.push_str("|%d|%d|%d");
            values.push(format!("{count}{i}, x{i}, r{i}"));
        }
        format!("string.format('{format}', {})", values.join(", "))
    }

    fn deny_and_dry_run(&mut self) {
        let n = self.shape.0.len();
        let any = if n == 0 {
            "0".to_owned()
        } else {
            (1..=n)
                .map(|i| format!("x{i}"))
                .collect::<Vec<_>>()
                .join(" + ")
        };
        let deny = self.reply("deny", 'c');
        let allow = self.reply("allow", 'a');
        let _ = writeln!(
            self.out,
            "if {any} > 0 then return {deny} end\nif ARGV[2] == '1' then return {allow} end"
        );
    }

    /// The limits (numbered from 1, as in the text) writing key `i`: limit i and those
    /// sharing its key.
    fn sharing(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        let me = (i - 1) as u8;
        self.shape
            .0
            .iter()
            .enumerate()
            .filter(move |(j, l)| *j == i - 1 || l.same_key_as == Some(me))
            .map(|(j, _)| j + 1)
    }

    /// The longest retain among the limits writing key `i` (limit i and those sharing it).
    fn retain(&self, i: usize) -> u64 {
        self.sharing(i)
            .map(|j| self.limit(j).retain_ms)
            .max()
            .unwrap_or(self.limit(i).retain_ms)
    }

    fn record(&mut self, i: usize) {
        let l = self.limit(i);
        if l.same_key_as.is_some() {
            // Written by the limit whose key it shares (limits.lua: a key is written once).
            return;
        }
        let w = l.window_ms;
        let margin = EXPIRY_MARGIN_MS;
        match l.algorithm {
            Algorithm::SlidingWindow => {
                let retain = self.retain(i);
                // Trimmed only when a limit on the key found a member in its window
                // (limits.lua, limits_record: why).
                let counted = self
                    .sharing(i)
                    .map(|j| format!("c{j} > 0"))
                    .collect::<Vec<_>>()
                    .join(" or ");
                let _ = writeln!(
                    self.out,
                    "if {counted} then redis.call('ZREMRANGEBYSCORE', k{i}, '-inf', now - {retain}) end\n\
                     redis.call('ZADD', k{i}, now, rid)\n\
                     redis.call('PEXPIRE', k{i}, {expire})",
                    expire = retain + margin
                );
            }
            Algorithm::FixedWindow => {
                let _ = writeln!(
                    self.out,
                    "if f{i} then\n  \
                       redis.call('HSET', k{i}, 's', s{i}, 'c', c{i} + 1)\n  \
                       redis.call('PEXPIRE', k{i}, s{i} + {w} - now + {margin})\n\
                     else\n  \
                       redis.call('HSET', k{i}, 'c', c{i} + 1)\n\
                     end"
                );
            }
            Algorithm::TokenBucket => {
                let _ = writeln!(
                    self.out,
                    "do\n  \
                       local left = t{i} - 1\n  \
                       redis.call('HSET', k{i}, 'tk', string.format('%.17g', left), 'ts', now, 'cap', m{i})\n  \
                       redis.call('PEXPIRE', k{i}, math.max(math.ceil((m{i} - left) * {w} / m{i} - 1e-9), 1) + {margin})\n\
                     end"
                );
            }
        }
    }

    fn record_and_reply(&mut self) {
        // The record: when, then the fixed windows and buckets written, which the caller
        // sends as ARGV[7] (limits.lua's header; the same text limits.lua builds); with an
        // idempotency key, its record (field ARGV[6]) in the same hash.
        let allow = self.reply("allow", 'a');
        let margin = EXPIRY_MARGIN_MS;
        let _ = writeln!(
            self.out,
            "local gen = math.max(tonumber(ARGV[4]) or 0, 1)\n\
             local g = math.floor(now / gen)\n\
             local rq = KEYS[1] .. ':' .. string.format('%d', g)\n\
             local value, added = string.format('%d', now - g * gen) .. ARGV[7]\n\
             if rep == 'i' or rep == 'ri' then\n  \
               added = redis.call('HSET', rq, rid, value, ARGV[6], rid, '#', '') - 2\n\
             else\n  \
               added = redis.call('HSET', rq, rid, value, '#', '') - 1\n\
             end\n\
             if added == 1 then redis.call('PEXPIRE', rq, (g + 2) * gen - now + {margin}) end\n\
             return {allow}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(limits: &[(&'static str, Algorithm, u64, u64)]) -> Shape {
        Shape::of(limits.iter().map(|&(k, a, w, r)| (k, a, w, 5, r))).expect("fits")
    }

    #[test]
    fn sliding_limits_over_one_key_are_one_shape_whose_first_writes_the_key() {
        let s = shape(&[
            ("u", Algorithm::SlidingWindow, 10_000, 60_000),
            ("u", Algorithm::SlidingWindow, 60_000, 60_000),
            ("ip", Algorithm::FixedWindow, 60_000, 60_000),
        ]);
        assert_eq!(s.0[1].same_key_as, Some(0));
        assert_eq!(s.0[2].same_key_as, None);
        let lua = s.lua();
        // One trim and one add for the shared ZSET, kept for the longest window.
        assert_eq!(lua.matches("ZADD").count(), 1, "{lua}");
        assert!(lua.contains("redis.call('PEXPIRE', k1, 61000)"), "{lua}");
    }

    #[test]
    fn the_max_is_not_part_of_the_shape() {
        let a = Shape::of([("u", Algorithm::FixedWindow, 1000, 3, 1000)].into_iter());
        let b = Shape::of([("v", Algorithm::FixedWindow, 1000, 300, 1000)].into_iter());
        assert_eq!(a, b);
    }

    #[test]
    fn too_many_limits_have_no_shape() {
        let limits = vec![("k", Algorithm::FixedWindow, 1000, 1, 1000); MAX_LIMITS + 1];
        assert_eq!(Shape::of(limits.into_iter()), None);
    }
}
