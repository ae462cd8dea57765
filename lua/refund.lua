--[[
refund.lua: give back the quota one counted request consumed, exactly and atomically.

KEYS[1]    records key (<prefix>:<scene>:rq:<dim>:<value>) as check.lua and decide.lua
           were given it; the record is a field of its hash of generation g or g - 1
           (limits.lua). Ignored when ARGV[2] is "0".
KEYS[2]    the request's own record key (<prefix>:<scene>:req:<request_id>): where records
           written before 2026-12 are, looked at only when the records hash has none
KEYS[3..]  candidate keys, recomputed by the caller from the refund's dimension values.
           A refund cannot reach a key the request never counted in: a fixed window or a
           bucket is touched only when the record names it, a sliding ZSET only by removing
           the request id, which only this request added.

ARGV[1]    request id
ARGV[2]    the record TTL (the generation's length), ms; "0": no records hash to look in
ARGV[3]    now in ms, or "" to read Redis TIME
ARGV[3+i]  the tag of candidate KEYS[2+i] (store::redis::record_tag)

Reply: 0 when the request is unknown (never counted, record expired); else a string of
one character per candidate key, in KEYS order from KEYS[3]: "1" when that key gave the
request back (or the record named it: a fixed window that has rolled over forgot it
already), "0" when it held nothing of the request — a key the check never counted in (a
dimension value the check did not carry, a `where` that did not match), a sliding window
that has moved past it, or a key refunded before. The caller names them to the backend.

Per candidate key, the record says how to undo:
  (not named) a sliding ZSET among the candidates (TYPE zset): remove the request id
             (exact; later members keep their places; a ZSET the request never counted in
             has no such member). Records do not name sliding keys.
  f<tag>     fixed window: decrement the count only while the window that counted the
             request is still the current one, that is while the window's start is not
             after the request (windows only move forward; a new one already forgot it)
  t<tag>     token bucket: one token back, capped at the capacity stored in the hash
             (refill is linear, so adding to the stored level equals adding now)
Undone keys leave the record (and the request id its ZSETs), which keeps its expiry: a
second refund of the same keys is 0, while a later refund naming a key that was missed the
first time still works. The record itself stays, so the same request id sent again is still
a duplicate.
]]

-- clock_now(), records_hash(): limits.lua; ENTRY, undo(): undo.lua. The service puts both
-- in front of this script (src/store/redis.rs), so the clock, a generation's hash and how
-- an entry is undone are named in one place (release.lua shares them).

local request_id = ARGV[1]

-- A record of the records hash `hash`, generation start `start`: "<ms>" then "f<tag>" or
-- "t<tag>" entries (limits.lua).
local function refund_record(hash, start, value)
  local ms = string.match(value, '^%d+')
  if not ms then
    return redis.error_reply('refund.lua: unreadable request record ' .. request_id .. ' in ' .. hash)
  end
  local t = start + tonumber(ms)
  local named = {}
  for kind, tag in string.gmatch(string.sub(value, #ms + 1), ENTRY) do
    named[tag] = kind
  end
  local given, changed = {}, false
  for i = 3, #KEYS do
    local tag = ARGV[i + 1]
    local how = named[tag]
    local back = undo(KEYS[i], how, t, request_id)
    if how ~= nil then
      named[tag] = nil
      back = true
      changed = true
    end
    given[#given + 1] = back and '1' or '0'
  end
  if changed then
    -- The entries not undone stay, in their order; HSET of an existing field keeps the
    -- hash's expiry.
    local kept = { ms }
    for kind, tag in string.gmatch(string.sub(value, #ms + 1), ENTRY) do
      if named[tag] == kind then
        kept[#kept + 1] = kind .. tag
      end
    end
    redis.call('HSET', hash, request_id, table.concat(kept))
  end
  return table.concat(given)
end

local gen = tonumber(ARGV[2]) or 0
if gen > 0 then
  local now = clock_now(ARGV[3])
  if now == nil then
    return redis.error_reply('refund.lua: now (ARGV[3]) is not a number')
  end
  local g = math.floor(now / gen)
  for _, gg in ipairs({ g, g - 1 }) do
    local hash = records_hash(KEYS[1], gg)
    local value = redis.call('HGET', hash, request_id)
    if value then
      return refund_record(hash, gg * gen, value)
    end
  end
end

-- A record written before 2026-12: one STRING per request, cjson
-- {"k": {<key>: "f:<start>" | "t" | "z"}}.
local raw = redis.call('GET', KEYS[2])
if not raw then
  return 0
end
local ok, rec = pcall(cjson.decode, raw)
if not ok or type(rec) ~= 'table' or type(rec.k) ~= 'table' then
  return redis.error_reply('refund.lua: unreadable request record at ' .. KEYS[2])
end

local given = {}
-- Whether an entry left the record (it is written back only then).
local changed = false

for i = 3, #KEYS do
  local key = KEYS[i]
  local how = rec.k[key]
  local back = false
  if how == nil then
    back = undo(key, nil, 0, request_id)
  elseif how == 'z' then
    redis.call('ZREM', key, request_id)
  elseif how == 't' then
    undo(key, 't', 0, request_id)
  elseif type(how) == 'string' and string.sub(how, 1, 2) == 'f:' then
    -- The window's start: a later window's start is after it.
    undo(key, 'f', tonumber(string.sub(how, 3)) or -1, request_id)
  end
  if how ~= nil then
    rec.k[key] = nil
    back = true
    changed = true
  end
  given[#given + 1] = back and '1' or '0'
end

if not changed then
  return table.concat(given)
end

-- KEEPTTL: the record must not outlive the windows it describes.
local encoded
if next(rec.k) == nil then
  encoded = '{"k":{}}'
else
  encoded = cjson.encode(rec)
end
redis.call('SET', KEYS[2], encoded, 'KEEPTTL')
return table.concat(given)
