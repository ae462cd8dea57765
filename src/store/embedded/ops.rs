//! The embedded store's changes as values: what a check or refund does to its keys, in a
//! form that is applied to memory and written to the journal alike, so replaying the
//! journal rebuilds exactly what memory held.
//!
//! Encoding (all integers big-endian): a record is `now u64` then ops; an op is a tag byte,
//! the key (u32 length + bytes), and the tag's payload. Strings are length-prefixed, so no
//! byte in a key or id can be mistaken for structure.

use super::entry::{Entry, KeyHash, Tag};
use super::shard::{Hashed, Shard};
use super::window::{Bucket, Fixed, Sliding};
use crate::store::EXPIRY_MARGIN_MS;

/// One change to one key.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// A request counted in a sliding window at `score`; the key lives `retain` past it.
    AddMember {
        key: String,
        score: u64,
        member: String,
        retain: u64,
    },
    /// A refunded request leaves a sliding window.
    RemoveMember { key: String, member: String },
    /// A whole non-sliding entry (fixed, bucket, record, idempotency key).
    Put { key: String, entry: Entry },
}

impl Op {
    pub fn key(&self) -> &str {
        match self {
            Op::AddMember { key, .. } | Op::RemoveMember { key, .. } | Op::Put { key, .. } => key,
        }
    }
}

/// Applies one op to the shard holding its key (`hash`: the key's, under the store's
/// hasher), as of `now`.
pub fn apply(shard: &mut Shard, hash: u64, now: u64, op: Op) {
    match op {
        Op::AddMember {
            key,
            score,
            member,
            retain,
        } => {
            // An expired key is absent: a new window starts from nothing.
            let e = shard.upsert(
                hash,
                key,
                |e| !e.is_live(now),
                || Entry::Sliding {
                    set: Sliding::default(),
                    retain,
                    expires_at: 0,
                },
            );
            if let Entry::Sliding {
                set,
                retain: r,
                expires_at,
            } = e
            {
                set.members.insert((score, member.into_boxed_str()));
                *r = retain;
                // The newest member decides how long the key lives.
                *expires_at = (*expires_at).max(score + retain + EXPIRY_MARGIN_MS);
            }
        }
        Op::RemoveMember { key, member } => {
            if let Some(Entry::Sliding { set, .. }) = shard.get_mut(Hashed { key: &key, hash }) {
                set.remove(&member);
            }
        }
        Op::Put { key, entry } => shard.insert(hash, key, entry),
    }
}

/// The ops that recreate `entry` under `key` (a snapshot of it).
pub fn recreate(key: &str, entry: &Entry, out: &mut Vec<Op>) {
    match entry {
        Entry::Sliding { set, retain, .. } => {
            for (score, member) in &set.members {
                out.push(Op::AddMember {
                    key: key.to_string(),
                    score: *score,
                    member: member.to_string(),
                    retain: *retain,
                });
            }
        }
        other => out.push(Op::Put {
            key: key.to_string(),
            entry: other.clone(),
        }),
    }
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Encodes one journal record.
pub fn encode(now: u64, ops: &[Op]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + ops.len() * 64);
    encode_into(now, ops, &mut out);
    out
}

/// Appends one encoded journal record to `out`.
pub fn encode_into(now: u64, ops: &[Op], out: &mut Vec<u8>) {
    put_u64(out, now);
    for op in ops {
        match op {
            Op::AddMember {
                key,
                score,
                member,
                retain,
            } => {
                out.push(b'm');
                put_str(out, key);
                put_u64(out, *score);
                put_u64(out, *retain);
                put_str(out, member);
            }
            Op::RemoveMember { key, member } => {
                out.push(b'x');
                put_str(out, key);
                put_str(out, member);
            }
            Op::Put { key, entry } => encode_entry(out, key, entry),
        }
    }
}

fn encode_entry(out: &mut Vec<u8>, key: &str, entry: &Entry) {
    match entry {
        // Sliding windows travel as their members (see `recreate`).
        Entry::Sliding { .. } => {}
        Entry::Fixed { state, expires_at } => {
            out.push(b'f');
            put_str(out, key);
            put_u64(out, state.start);
            put_u64(out, state.count);
            put_u64(out, *expires_at);
        }
        Entry::Bucket { state, expires_at } => {
            out.push(b't');
            put_str(out, key);
            put_u64(out, state.tokens.to_bits());
            put_u64(out, state.ts);
            put_u64(out, state.cap);
            put_u64(out, *expires_at);
        }
        // `R`: keys as their hashes. (`r`, written before 2026-12, named them in full.)
        Entry::Record { keys, expires_at } => {
            out.push(b'R');
            put_str(out, key);
            put_u64(out, *expires_at);
            out.extend_from_slice(&(keys.len() as u32).to_be_bytes());
            for (k, tag) in keys {
                put_u64(out, k.0);
                match tag {
                    Tag::Bucket => out.push(b't'),
                    Tag::Fixed { start } => {
                        out.push(b'f');
                        put_u64(out, *start);
                    }
                }
            }
        }
        Entry::Idem {
            request_id,
            expires_at,
        } => {
            out.push(b'i');
            put_str(out, key);
            put_u64(out, *expires_at);
            put_str(out, request_id);
        }
    }
}

/// A cursor over an encoded record.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }

    fn u64(&mut self) -> Option<u64> {
        let v = u64::from_be_bytes(self.0.get(..8)?.try_into().ok()?);
        self.0 = &self.0[8..];
        Some(v)
    }

    fn u32(&mut self) -> Option<u32> {
        let v = u32::from_be_bytes(self.0.get(..4)?.try_into().ok()?);
        self.0 = &self.0[4..];
        Some(v)
    }

    fn str(&mut self) -> Option<String> {
        let len = self.u32()? as usize;
        let s = std::str::from_utf8(self.0.get(..len)?).ok()?.to_string();
        self.0 = &self.0[len..];
        Some(s)
    }
}

/// Decodes one journal record; `None` when it is damaged.
pub fn decode(bytes: &[u8]) -> Option<(u64, Vec<Op>)> {
    let mut r = Reader(bytes);
    let now = r.u64()?;
    let mut ops = Vec::new();
    while !r.0.is_empty() {
        let tag = r.u8()?;
        let key = r.str()?;
        let op = match tag {
            b'm' => {
                let score = r.u64()?;
                let retain = r.u64()?;
                Op::AddMember {
                    key,
                    score,
                    member: r.str()?,
                    retain,
                }
            }
            b'x' => Op::RemoveMember {
                key,
                member: r.str()?,
            },
            b'f' => Op::Put {
                key,
                entry: Entry::Fixed {
                    state: Fixed {
                        start: r.u64()?,
                        count: r.u64()?,
                    },
                    expires_at: r.u64()?,
                },
            },
            b't' => Op::Put {
                key,
                entry: Entry::Bucket {
                    state: Bucket {
                        tokens: f64::from_bits(r.u64()?),
                        ts: r.u64()?,
                        cap: r.u64()?,
                    },
                    expires_at: r.u64()?,
                },
            },
            kind @ (b'r' | b'R') => {
                let expires_at = r.u64()?;
                let n = r.u32()? as usize;
                let mut keys = Vec::with_capacity(n.min(64));
                for _ in 0..n {
                    let k = if kind == b'R' {
                        KeyHash(r.u64()?)
                    } else {
                        KeyHash::of(&r.str()?)
                    };
                    let tag = match r.u8()? {
                        // A sliding window is refunded by its member; the note is not kept.
                        b'z' => continue,
                        b't' => Tag::Bucket,
                        b'f' => Tag::Fixed { start: r.u64()? },
                        _ => return None,
                    };
                    keys.push((k, tag));
                }
                Op::Put {
                    key,
                    entry: Entry::Record { keys, expires_at },
                }
            }
            b'i' => {
                let expires_at = r.u64()?;
                Op::Put {
                    key,
                    entry: Entry::Idem {
                        request_id: r.str()?,
                        expires_at,
                    },
                }
            }
            _ => return None,
        };
        ops.push(op);
    }
    Some((now, ops))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_round_trips() {
        let ops = vec![
            Op::AddMember {
                key: "k:\u{0}:x".into(),
                score: 100,
                member: "r1".into(),
                retain: 1000,
            },
            Op::RemoveMember {
                key: "k".into(),
                member: "r0".into(),
            },
            Op::Put {
                key: "f".into(),
                entry: Entry::Fixed {
                    state: Fixed {
                        start: 60,
                        count: 2,
                    },
                    expires_at: 5000,
                },
            },
            Op::Put {
                key: "t".into(),
                entry: Entry::Bucket {
                    state: Bucket {
                        tokens: 2.5,
                        ts: 7,
                        cap: 3,
                    },
                    expires_at: 5000,
                },
            },
            Op::Put {
                key: "rec".into(),
                entry: Entry::Record {
                    keys: vec![
                        (KeyHash::of("f"), Tag::Fixed { start: 60 }),
                        (KeyHash(u64::MAX), Tag::Bucket),
                    ],
                    expires_at: 5000,
                },
            },
            Op::Put {
                key: "idem".into(),
                entry: Entry::Idem {
                    request_id: "r1".into(),
                    expires_at: 5000,
                },
            },
        ];
        let bytes = encode(42, &ops);
        assert_eq!(decode(&bytes), Some((42, ops)));
        assert_eq!(
            decode(&bytes[..bytes.len() - 1]),
            None,
            "a torn record is refused"
        );
    }

    /// A journal written before records named keys by hash still replays: each named
    /// fixed window or bucket becomes its hash, and the sliding notes (refunded by the
    /// member now) are dropped.
    #[test]
    fn a_record_naming_keys_in_full_reads_as_their_hashes() {
        let mut old = Vec::new();
        put_u64(&mut old, 42);
        old.push(b'r');
        put_str(&mut old, "lt:s:req:r1");
        put_u64(&mut old, 5000);
        old.extend_from_slice(&3u32.to_be_bytes());
        put_str(&mut old, "lt:s:uid:u");
        old.push(b'z');
        put_str(&mut old, "lt:s:fw:ip_1m:ip:192.0.2.1");
        old.push(b'f');
        put_u64(&mut old, 60_000);
        put_str(&mut old, "lt:s:tb:act_b:act:a");
        old.push(b't');
        assert_eq!(
            decode(&old),
            Some((
                42,
                vec![Op::Put {
                    key: "lt:s:req:r1".into(),
                    entry: Entry::Record {
                        keys: vec![
                            (
                                KeyHash::of("lt:s:fw:ip_1m:ip:192.0.2.1"),
                                Tag::Fixed { start: 60_000 }
                            ),
                            (KeyHash::of("lt:s:tb:act_b:act:a"), Tag::Bucket),
                        ],
                        expires_at: 5000,
                    },
                }]
            ))
        );
        // FNV-1a 64 (its published test vector): the hash must never change, or journaled
        // records would stop matching their keys.
        assert_eq!(KeyHash::of("a"), KeyHash(0xaf63dc4c8601ec8c));
    }

    #[test]
    fn replay_rebuilds_what_apply_built() {
        let hasher = super::super::shard::Hasher::default();
        let hash = |k: &str| Hashed::new(&hasher, k).hash;
        let mut live = Shard::new(hasher.clone());
        apply(
            &mut live,
            hash("k"),
            100,
            Op::AddMember {
                key: "k".into(),
                score: 100,
                member: "a".into(),
                retain: 1000,
            },
        );
        let mut snapshot = Vec::new();
        let held = live.get(Hashed::new(&hasher, "k")).cloned();
        recreate("k", held.as_ref().expect("k was added"), &mut snapshot);
        let mut rebuilt = Shard::new(hasher.clone());
        for op in snapshot {
            apply(&mut rebuilt, hash(op.key()), 100, op);
        }
        assert_eq!(rebuilt.get(Hashed::new(&hasher, "k")).cloned(), held);
        assert_eq!(rebuilt.len(), live.len());
    }
}
