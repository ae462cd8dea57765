//! The embedded store's durable mirror in sled: every change to a key is written, in the
//! same sled batch, while the key's shard is locked, so sled always holds what memory
//! holds (up to sled's flush interval after a crash). On open the tree is read back into
//! memory and expired entries are dropped.
//!
//! Layout: sled key = kind byte, key length (u32 BE), key bytes, and for a sliding
//! member the member bytes; length-prefixing keeps any two keys apart whatever bytes they
//! hold. A sliding window is one sled entry per member (value: score, retain), so an add
//! writes a few bytes, not the whole set. Numbers are big-endian u64 (f64 as its bits).

use std::collections::HashMap;

use super::entry::{Entry, Tag};
use super::window::{Bucket, Fixed, Sliding};
use crate::store::EXPIRY_MARGIN_MS;

const SLIDING: u8 = b'z';
const FIXED: u8 = b'f';
const BUCKET: u8 = b't';
const RECORD: u8 = b'r';
const IDEM: u8 = b'i';

fn sled_key(kind: u8, key: &str, member: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(5 + key.len() + member.len());
    k.push(kind);
    k.extend_from_slice(&(key.len() as u32).to_be_bytes());
    k.extend_from_slice(key.as_bytes());
    k.extend_from_slice(member.as_bytes());
    k
}

fn u64s(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_be_bytes()).collect()
}

/// Reads the `i`-th big-endian u64 of `v`.
fn at(v: &[u8], i: usize) -> Option<u64> {
    v.get(i * 8..i * 8 + 8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
}

/// The sled key of one sliding member.
pub fn member_key(key: &str, member: &str) -> Vec<u8> {
    sled_key(SLIDING, key, member)
}

/// Writes a sliding member.
pub fn put_member(batch: &mut sled::Batch, key: &str, score: u64, member: &str, retain: u64) {
    batch.insert(member_key(key, member), u64s(&[score, retain]));
}

/// Writes a whole non-sliding entry (sliding members are written one by one).
pub fn put(batch: &mut sled::Batch, key: &str, entry: &Entry) {
    match entry {
        Entry::Sliding { .. } => {}
        Entry::Fixed { state, expires_at } => batch.insert(
            sled_key(FIXED, key, ""),
            u64s(&[state.start, state.count, *expires_at]),
        ),
        Entry::Bucket { state, expires_at } => batch.insert(
            sled_key(BUCKET, key, ""),
            u64s(&[state.tokens.to_bits(), state.ts, state.cap, *expires_at]),
        ),
        Entry::Record { keys, expires_at } => {
            let mut v = u64s(&[*expires_at]);
            for (k, tag) in keys {
                v.extend_from_slice(&(k.len() as u32).to_be_bytes());
                v.extend_from_slice(k.as_bytes());
                match tag {
                    Tag::Sliding => v.push(b'z'),
                    Tag::Bucket => v.push(b't'),
                    Tag::Fixed { start } => {
                        v.push(b'f');
                        v.extend_from_slice(&start.to_be_bytes());
                    }
                }
            }
            batch.insert(sled_key(RECORD, key, ""), v);
        }
        Entry::Idem {
            request_id,
            expires_at,
        } => {
            let mut v = u64s(&[*expires_at]);
            v.extend_from_slice(request_id.as_bytes());
            batch.insert(sled_key(IDEM, key, ""), v);
        }
    }
}

/// Removes everything persisted for `key` as it stood in `entry`.
pub fn delete(batch: &mut sled::Batch, key: &str, entry: &Entry) {
    let kind = match entry {
        Entry::Sliding { set, .. } => {
            for (_, m) in &set.members {
                batch.remove(member_key(key, m));
            }
            return;
        }
        Entry::Fixed { .. } => FIXED,
        Entry::Bucket { .. } => BUCKET,
        Entry::Record { .. } => RECORD,
        Entry::Idem { .. } => IDEM,
    };
    batch.remove(sled_key(kind, key, ""));
}

fn split_key(raw: &[u8]) -> Option<(u8, String, String)> {
    let kind = *raw.first()?;
    let len = u32::from_be_bytes(raw.get(1..5)?.try_into().ok()?) as usize;
    let key = std::str::from_utf8(raw.get(5..5 + len)?).ok()?.to_string();
    let member = std::str::from_utf8(raw.get(5 + len..)?).ok()?.to_string();
    Some((kind, key, member))
}

fn decode_record(v: &[u8]) -> Option<Entry> {
    let expires_at = at(v, 0)?;
    let mut keys = Vec::new();
    let mut rest = v.get(8..)?;
    while !rest.is_empty() {
        let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let key = std::str::from_utf8(rest.get(4..4 + len)?).ok()?.to_string();
        rest = rest.get(4 + len..)?;
        let (tag, used) = match rest.first()? {
            b'z' => (Tag::Sliding, 1),
            b't' => (Tag::Bucket, 1),
            b'f' => (
                Tag::Fixed {
                    start: u64::from_be_bytes(rest.get(1..9)?.try_into().ok()?),
                },
                9,
            ),
            _ => return None,
        };
        keys.push((key, tag));
        rest = rest.get(used..)?;
    }
    Some(Entry::Record { keys, expires_at })
}

/// What was read back from sled.
pub struct Loaded {
    pub entries: HashMap<String, Entry>,
    /// Sled keys of expired or unreadable data, to delete.
    pub stale: Vec<sled::IVec>,
}

/// Reads the whole tree back; entries expired at `now` are returned as stale.
pub fn load(tree: &sled::Tree, now: u64) -> Result<Loaded, sled::Error> {
    let mut entries: HashMap<String, Entry> = HashMap::new();
    let mut stale = Vec::new();
    for item in tree.iter() {
        let (k, v) = item?;
        let Some((kind, key, member)) = split_key(&k) else {
            stale.push(k);
            continue;
        };
        let entry = match kind {
            SLIDING => {
                let (Some(score), Some(retain)) = (at(&v, 0), at(&v, 1)) else {
                    stale.push(k);
                    continue;
                };
                // Members older than their window are as good as trimmed.
                if score + retain <= now {
                    stale.push(k);
                    continue;
                }
                let e = entries.entry(key).or_insert_with(|| Entry::Sliding {
                    set: Sliding::default(),
                    retain: 0,
                    expires_at: 0,
                });
                if let Entry::Sliding {
                    set,
                    retain: r,
                    expires_at,
                } = e
                {
                    set.members.insert((score, member.into_boxed_str()));
                    *r = (*r).max(retain);
                    *expires_at = (*expires_at).max(score + retain + EXPIRY_MARGIN_MS);
                }
                continue;
            }
            FIXED => match (at(&v, 0), at(&v, 1), at(&v, 2)) {
                (Some(start), Some(count), Some(expires_at)) => Some(Entry::Fixed {
                    state: Fixed { start, count },
                    expires_at,
                }),
                _ => None,
            },
            BUCKET => match (at(&v, 0), at(&v, 1), at(&v, 2), at(&v, 3)) {
                (Some(tk), Some(ts), Some(cap), Some(expires_at)) => Some(Entry::Bucket {
                    state: Bucket {
                        tokens: f64::from_bits(tk),
                        ts,
                        cap,
                    },
                    expires_at,
                }),
                _ => None,
            },
            RECORD => decode_record(&v),
            IDEM => at(&v, 0).and_then(|expires_at| {
                Some(Entry::Idem {
                    request_id: std::str::from_utf8(v.get(8..)?).ok()?.to_string(),
                    expires_at,
                })
            }),
            _ => None,
        };
        match entry {
            Some(e) if e.is_live(now) => {
                entries.insert(key, e);
            }
            _ => stale.push(k),
        }
    }
    Ok(Loaded { entries, stale })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_sled() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path()).unwrap();
        let tree = db.open_tree("w").unwrap();
        let mut batch = sled::Batch::default();
        let fixed = Entry::Fixed {
            state: Fixed {
                start: 60,
                count: 2,
            },
            expires_at: 5000,
        };
        let bucket = Entry::Bucket {
            state: Bucket {
                tokens: 2.5,
                ts: 7,
                cap: 3,
            },
            expires_at: 5000,
        };
        let record = Entry::Record {
            keys: vec![
                ("a:b".into(), Tag::Sliding),
                ("f:x".into(), Tag::Fixed { start: 60 }),
                ("t".into(), Tag::Bucket),
            ],
            expires_at: 5000,
        };
        let idem = Entry::Idem {
            request_id: "r1".into(),
            expires_at: 5000,
        };
        put(&mut batch, "f:x", &fixed);
        put(&mut batch, "t", &bucket);
        put(&mut batch, "rec", &record);
        put(&mut batch, "idem", &idem);
        put_member(&mut batch, "a:b", 100, "r1", 1000);
        put_member(&mut batch, "a:b", 200, "r2", 1000);
        put_member(&mut batch, "old", 1, "r0", 10);
        tree.apply_batch(batch).unwrap();
        let loaded = load(&tree, 150).unwrap();
        assert_eq!(loaded.entries["f:x"], fixed);
        assert_eq!(loaded.entries["t"], bucket);
        assert_eq!(loaded.entries["rec"], record);
        assert_eq!(loaded.entries["idem"], idem);
        match &loaded.entries["a:b"] {
            Entry::Sliding {
                set,
                retain,
                expires_at,
            } => {
                assert_eq!(set.members.len(), 2);
                assert_eq!(*retain, 1000);
                assert_eq!(*expires_at, 200 + 1000 + EXPIRY_MARGIN_MS);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(loaded.stale.len(), 1, "the expired member is stale");
        // Past every expiry, everything is stale.
        assert_eq!(load(&tree, 1_000_000).unwrap().entries.len(), 0);
    }
}
