//! One shard of the embedded store: its keys in a hash table that takes each key's hash
//! from the caller, so a check hashes each of its keys once — for the shard it locks, and
//! for every lookup and write inside it — instead of once per lookup (issue 13: a key
//! was hashed five times per check).

use hashbrown::hash_table::{Entry as Slot, HashTable};

use super::entry::Entry;

/// The hasher of shard choice and shard tables: keys carry ids callers send, so it is
/// seeded per process (as quick_cache, the over-limit cache, is); foldhash's quality
/// variant costs a fraction of SipHash on these 40-80 byte keys.
pub type Hasher = foldhash::quality::RandomState;

/// A key and its hash under the store's [`Hasher`].
#[derive(Debug, Clone, Copy)]
pub struct Hashed<'k> {
    pub key: &'k str,
    pub hash: u64,
}

impl<'k> Hashed<'k> {
    pub fn new(hasher: &Hasher, key: &'k str) -> Self {
        use std::hash::BuildHasher as _;
        Hashed {
            key,
            hash: hasher.hash_one(key),
        }
    }

    /// The shard of `shards` this key lives in ([`shard_of`]).
    pub fn shard(&self, shards: usize) -> usize {
        shard_of(self.hash, shards)
    }
}

/// The shard of `shards` a key hashed as `hash` lives in. From the hash's bits 40 and up:
/// the table inside the shard takes its bucket from the low bits and its tag from the top
/// seven, so keys that share a shard do not also share buckets.
pub fn shard_of(hash: u64, shards: usize) -> usize {
    ((hash >> 40) as usize) % shards
}

/// The keys of one shard and what each holds.
#[derive(Debug)]
pub struct Shard {
    table: HashTable<(String, Entry)>,
    /// The store's hasher: the table rehashes its keys with it when it grows.
    hasher: Hasher,
}

impl Shard {
    pub fn new(hasher: Hasher) -> Self {
        Shard {
            table: HashTable::new(),
            hasher,
        }
    }

    fn rehash(hasher: &Hasher) -> impl Fn(&(String, Entry)) -> u64 + '_ {
        use std::hash::BuildHasher as _;
        move |(k, _)| hasher.hash_one(k)
    }

    pub fn get(&self, k: Hashed<'_>) -> Option<&Entry> {
        self.table
            .find(k.hash, |(key, _)| key == k.key)
            .map(|(_, e)| e)
    }

    pub fn get_mut(&mut self, k: Hashed<'_>) -> Option<&mut Entry> {
        self.table
            .find_mut(k.hash, |(key, _)| key == k.key)
            .map(|(_, e)| e)
    }

    /// The live entry under `k`; an expired one is dropped (replay drops it too). One
    /// lookup: a check reads each of its keys here, and the table is mostly cache misses.
    pub fn live(&mut self, k: Hashed<'_>, now: u64) -> Option<&mut Entry> {
        match self.table.find_entry(k.hash, |(key, _)| key == k.key) {
            Ok(e) if e.get().1.is_live(now) => Some(&mut e.into_mut().1),
            Ok(e) => {
                e.remove();
                None
            }
            Err(_) => None,
        }
    }

    /// Puts `entry` under `key` (hashed as `hash`), replacing what it held.
    pub fn insert(&mut self, hash: u64, key: String, entry: Entry) {
        match self
            .table
            .entry(hash, |(k, _)| *k == key, Self::rehash(&self.hasher))
        {
            Slot::Occupied(mut e) => e.get_mut().1 = entry,
            Slot::Vacant(e) => {
                e.insert((key, entry));
            }
        }
    }

    /// The entry under `key` (hashed as `hash`), replaced by `fresh()` when it is absent
    /// or `stale` says so.
    pub fn upsert(
        &mut self,
        hash: u64,
        key: String,
        stale: impl FnOnce(&Entry) -> bool,
        fresh: impl FnOnce() -> Entry,
    ) -> &mut Entry {
        match self
            .table
            .entry(hash, |(k, _)| *k == key, Self::rehash(&self.hasher))
        {
            Slot::Occupied(e) => {
                let slot = &mut e.into_mut().1;
                if stale(slot) {
                    *slot = fresh();
                }
                slot
            }
            Slot::Vacant(e) => &mut e.insert((key, fresh())).into_mut().1,
        }
    }

    /// Keeps the entries `keep` says to.
    pub fn retain(&mut self, mut keep: impl FnMut(&Entry) -> bool) {
        self.table.retain(|(_, e)| keep(e));
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.table.iter().map(|(k, e)| (k.as_str(), e))
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    pub fn shrink_to_fit(&mut self) {
        self.table.shrink_to_fit(Self::rehash(&self.hasher));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_found_by_its_hash_and_text_and_an_expired_one_is_dropped_on_read() {
        let hasher = Hasher::default();
        let mut shard = Shard::new(hasher.clone());
        let idem = |expires_at| Entry::Idem {
            request_id: "r".into(),
            expires_at,
        };
        // Enough keys that the table grows (and rehashes with the store's hasher) a few
        // times: every key must still be found under the hash its caller computed.
        let keys: Vec<String> = (0..1000).map(|i| format!("lt:s:k:{i}")).collect();
        for (i, key) in keys.iter().enumerate() {
            let k = Hashed::new(&hasher, key);
            shard.insert(k.hash, key.clone(), idem(100 + i as u64));
        }
        assert_eq!(shard.len(), 1000);
        for (i, key) in keys.iter().enumerate() {
            let k = Hashed::new(&hasher, key);
            assert_eq!(shard.get(k), Some(&idem(100 + i as u64)), "{key}");
        }
        // Same hash, other text: not the same key.
        let first = Hashed::new(&hasher, &keys[0]);
        assert!(shard
            .get(Hashed {
                key: "another",
                hash: first.hash
            })
            .is_none());
        // Live until its expiry; read after it, it is gone.
        assert!(shard.live(first, 99).is_some());
        assert!(shard.live(first, 100).is_none());
        assert!(shard.get(first).is_none());
        assert_eq!(shard.len(), 999);

        // The reaper shrinks a shard that emptied out: the table rehashes with the same
        // hasher, so what stays is still found.
        shard.retain(|e| e.expires_at() >= 900);
        assert_eq!(shard.len(), 200);
        shard.shrink_to_fit();
        assert!(shard.capacity() < 1000);
        for (i, key) in keys.iter().enumerate().skip(800) {
            let k = Hashed::new(&hasher, key);
            assert_eq!(shard.get(k), Some(&idem(100 + i as u64)), "{key}");
        }

        let second = Hashed::new(&hasher, &keys[1]);
        let e = shard.upsert(
            second.hash,
            keys[1].clone(),
            |e| !e.is_live(200),
            || idem(7),
        );
        assert_eq!(*e, idem(7), "an expired entry is replaced");
        let e = shard.upsert(second.hash, keys[1].clone(), |e| !e.is_live(0), || idem(9));
        assert_eq!(*e, idem(7), "a live one is kept");
    }
}
