--[[
trust_award.lua: record one trust award, at most once per event id.

KEYS[1]    the user's awards ZSET (<prefix>:trust-points:uid:<user>)

ARGV[1]    member: "<points>:<type>:<event_id>" (type: payment_succeeded | identity_verified
           | challenge_passed; points and type never contain ':', so everything after the
           second ':' is the id)
ARGV[2]    event id (a challenge pass's is scoped: "<scope>/<event_id>")
ARGV[3]    expires_at, unix ms (the member's score)
ARGV[4]    now in ms, or "" to read Redis TIME (tests inject a manual clock here)

Reply: 1 when the award was added; 0 when that event id is already awarded (under any
points or type: a replay, or the same event accepted by another node under other rules) or
the award has already expired.

Expired members (score <= now) are trimmed first. The key's expiry is PEXPIREAT the largest
score, so the key never outlives its newest award and never dies before it.
]]

local key = KEYS[1]
local now
if ARGV[4] ~= '' then
  now = tonumber(ARGV[4])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

redis.call('ZREMRANGEBYSCORE', key, '-inf', now)

local expires_at = tonumber(ARGV[3])
if expires_at == nil or expires_at <= now then
  return 0
end

-- Idempotence by event id, whatever points it was given: a user holds a handful of awards,
-- so a scan is cheap.
local event_id = ARGV[2]
for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do
  if string.match(m, '^%d+:[%a_]+:(.*)$') == event_id then
    return 0
  end
end

redis.call('ZADD', key, expires_at, ARGV[1])
local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', key, top[2])
return 1
