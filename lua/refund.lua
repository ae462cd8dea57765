--[[
refund.lua: give back the quota one counted request consumed, exactly and atomically.

KEYS[1]    request record key, as written by check.lua or decide.lua (limits.lua)
KEYS[2..]  candidate keys, recomputed by the caller from the refund's dimension values.
           A refund cannot reach a key the request never counted in: a fixed window or a
           bucket is touched only when the record names it, a sliding ZSET only by removing
           the request id, which only this request added.

ARGV[1]    request id

Reply: 1 when something was given back, 0 when the request is unknown (never counted,
record expired) or every candidate key was already refunded.

Per key, the record says how to undo:
  (absent)   a sliding ZSET among the candidates (TYPE zset): remove the request id
             (exact; later members keep their places; a ZSET the request never counted in
             has no such member). The record does not name sliding keys.
  "z"        the same, in a record written before 2026-12
  "f:<start>" fixed window: decrement the count only while the window that counted the
             request is still the current one; a new window already forgot it
  "t"        token bucket: one token back, capped at the capacity stored in the hash
             (refill is linear, so adding to the stored level equals adding now)
Undone keys leave the record (and the request id its ZSETs), which keeps its TTL: a second
refund of the same keys is 0, while a later refund naming a key that was missed the first
time still works. The record itself stays, so the same request id sent again is still a
duplicate.
]]

local raw = redis.call('GET', KEYS[1])
if not raw then
  return 0
end
local ok, rec = pcall(cjson.decode, raw)
if not ok or type(rec) ~= 'table' or type(rec.k) ~= 'table' then
  return redis.error_reply('refund.lua: unreadable request record at ' .. KEYS[1])
end

local request_id = ARGV[1]
local undone = 0
-- Whether an entry left the record (it is written back only then).
local changed = false

for i = 2, #KEYS do
  local key = KEYS[i]
  local how = rec.k[key]
  if how == nil then
    if redis.call('TYPE', key).ok == 'zset' and redis.call('ZREM', key, request_id) == 1 then
      undone = undone + 1
    end
  elseif how == 'z' then
    redis.call('ZREM', key, request_id)
  elseif how == 't' then
    local h = redis.call('HMGET', key, 'tk', 'cap')
    -- An absent bucket is a full one: nothing to give back.
    if h[1] and h[2] then
      local tk = math.min(tonumber(h[1]) + 1, tonumber(h[2]))
      redis.call('HSET', key, 'tk', string.format('%.17g', tk))
    end
  elseif type(how) == 'string' and string.sub(how, 1, 2) == 'f:' then
    local h = redis.call('HMGET', key, 's', 'c')
    if h[1] and h[1] == string.sub(how, 3) and (tonumber(h[2]) or 0) > 0 then
      redis.call('HINCRBY', key, 'c', -1)
    end
  end
  if how ~= nil then
    rec.k[key] = nil
    undone = undone + 1
    changed = true
  end
end

if undone == 0 then
  return 0
end
if not changed then
  return 1
end

-- KEEPTTL: the record must not outlive the windows it describes.
local encoded
if next(rec.k) == nil then
  encoded = '{"k":{}}'
else
  encoded = cjson.encode(rec)
end
redis.call('SET', KEYS[1], encoded, 'KEEPTTL')
return 1
