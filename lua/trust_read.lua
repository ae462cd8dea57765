--[[
trust_read.lua: a user's unexpired trust points and first sighting, in one round trip.

KEYS[1]    the user's awards ZSET (<prefix>:trust-points:uid:<user>)
KEYS[2]    the user's first sighting (<prefix>:user-seen:uid:<user>), a STRING of unix ms

ARGV[1]    now in ms, or "" to read Redis TIME (tests inject a manual clock here)
ARGV[2]    "1": mark the user seen (record now if never seen; refresh the retention of an
           existing sighting), "0": only read
ARGV[3]    retention of a sighting, ms (refreshed on every marked read)

Reply: {points, first_seen_ms}; points is the uncapped sum over unexpired awards (members
"<points>:<type>:<event_id>"), first_seen_ms is -1 when the user was never seen.

Expired members (score <= now) are trimmed, so what the check reads is what the key holds.
]]

local awards, seen = KEYS[1], KEYS[2]
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

redis.call('ZREMRANGEBYSCORE', awards, '-inf', now)
local points = 0
for _, m in ipairs(redis.call('ZRANGE', awards, 0, -1)) do
  points = points + (tonumber(string.match(m, '^(%d+):')) or 0)
end

local first_seen = redis.call('GET', seen)
if ARGV[2] == '1' then
  if first_seen then
    redis.call('PEXPIRE', seen, ARGV[3])
  else
    first_seen = tostring(now)
    redis.call('SET', seen, first_seen, 'PX', ARGV[3])
  end
end

return {points, tonumber(first_seen) or -1}
