--[[
check.lua: evaluate every limit of one check and, only if none is exceeded, record the
request in all of them. One EVALSHA is one atomic check: a denied request consumes nothing
in any dimension and touches no expiry. The window store (src/store/redis.rs) runs it after
limits.lua, which defines the arithmetic: the same as decide.lua's limits, line for line.
The Redis decider (src/decide/redis.rs) runs it too, for a check with limits only (no
trust, no score, no signals): what decide.lua would do for such a check, without the
machinery for the rest (~15 % of Redis's CPU per check).
Both send it only checks with more than 16 limits: below that they run the script
src/store/limits_script.rs makes from this one for the check's shape of limits (same
KEYS, the same reply in one string, its limit parameters written into the text), ~30 %
cheaper again; tests/it/limits_script.rs holds the two to the same answers and the same
keys.

KEYS[1]    records key (<prefix>:<scene>:rq:<dim>:<value>, the check's first entity): the
           request's record goes to a hash of it per generation (limits.lua), holding,
           for refund.lua, what this request added where
KEYS[1+i]  the key of limit i, in the order of the limits. Sliding limits over the same
           dimensions share one ZSET, so a key may appear more than once

ARGV[1]    request id (the ZSET member)
ARGV[2]    dry run: "1" decides and writes nothing, "0" records; on Redis Cluster
           "0.<digits>" records, the record ending in ".<digits>" (the reservation's stamp,
           limits.lua)
ARGV[3]    the repeats to look for, as decide.lua's: "r" the request's record (the caller
           named the request id), "i" the idempotency key (ARGV[6]), "ri" both, "" neither
ARGV[4]    record TTL, ms: the request records' generation (a record lives at least this
           long and less than twice it)
ARGV[5]    now in ms, or "" to read Redis TIME (production: every node agrees on the time;
           tests inject a manual clock here)
ARGV[6]    the idempotency record's field in the records hash ("i:<key>"), or "" without
           an idempotency key
ARGV[7+5*(i-1) .. 11+5*(i-1)], for limit i:
           algorithm ("s" sliding window, "f" fixed window, "t" token bucket),
           window_ms, max, retain_ms (sliding: the longest window sharing the key), tag
           (fixed window, bucket: how the record names the key; "" for sliding)

Reply, a flat array:
  {"allow", "", n, count_1, exceeded_1, retry_after_ms_1, ..., count_n, exceeded_n, retry_after_ms_n}
  {"deny",  "", n, ...same triples...}
  {"dup",   <request id that was counted>, 0}
  {"held",  <request id>, 0}: as "dup", but its record is a reservation not yet decided
           (Redis Cluster: another attempt is in flight, or was denied and not yet released)
  count: allow -> the count including this request; deny -> the count before it.
  Token buckets report tokens spent (capacity minus tokens left, rounded up).
  exceeded: 1 or 0. retry_after_ms: ms until that limit admits one more (0 when not exceeded).

Stored shapes (limit keys, the request and idempotency records) and expiries: see
limits.lua.
]]

local request_id = ARGV[1]
local dry_run = ARGV[2] == '1'
local has_idem = ARGV[3] == 'i' or ARGV[3] == 'ri'
local by_id = ARGV[3] == 'r' or ARGV[3] == 'ri'
local record_ttl = math.max(tonumber(ARGV[4]) or 0, 1)
local idem_field = nil
if has_idem then
  idem_field = ARGV[6]
end

-- Every limit, checked before anything is read or written.
local n = #KEYS - 1
local limits = {}
for i = 1, n do
  local base = 7 + 5 * (i - 1)
  local l = {
    key = KEYS[1 + i],
    algo = ARGV[base],
    window = tonumber(ARGV[base + 1]),
    max = tonumber(ARGV[base + 2]),
    retain = tonumber(ARGV[base + 3]),
    tag = ARGV[base + 4],
    applies = true,
    -- Every field limits.lua fills in, so the table is sized once (as decide.lua's).
    count = 0, after = 0, exceeded = false, retry = 0, start = 0, fresh = false, tokens = 0,
  }
  if not LIMIT_ALGORITHMS[l.algo] then
    return redis.error_reply('check.lua: unknown algorithm ' .. tostring(l.algo))
  end
  limits[i] = l
end

local now = clock_now(ARGV[5])
if now == nil then
  return redis.error_reply('check.lua: now (ARGV[5]) is not a number')
end

local first, held = counted_before(KEYS[1], record_ttl, now, request_id, by_id, idem_field)
if first then
  return {held and 'held' or 'dup', first, 0}
end

local function reply(kind, use_after)
  local out = {kind, '', n}
  for i = 1, n do
    limit_reply(out, limits[i], use_after)
  end
  return out
end

-- Phase 1: read, decide every limit (phase 2 trims what it records in). Nothing that changes a
-- count is written here. All-or-nothing: one exceeded limit and nothing is recorded
-- anywhere.
if limits_evaluate(limits, now, dry_run) then
  return reply('deny', false)
end
if dry_run then
  return reply('allow', true)
end

-- Phase 2: add to every key, write the request and idempotency records.
limits_record(limits, now, request_id, KEYS[1], idem_field, record_ttl, string.sub(ARGV[2], 2))

return reply('allow', true)
