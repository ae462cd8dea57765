--[[
trust_awards.lua: a user's unexpired awards, for GET /v1/trust/{user_id}.

KEYS[1]    the user's awards ZSET (<prefix>:trust-points:uid:<user>)

ARGV[1]    now in ms, or "" to read Redis TIME (tests inject a manual clock here)

Reply: a flat array {member_1, expires_at_ms_1, member_2, expires_at_ms_2, ...}, oldest
expiry first; members are "<points>:<type>:<event_id>", expiries integers.

Expired members (score <= now) are trimmed first.
]]

local key = KEYS[1]
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local raw = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
local out = {}
for i = 1, #raw, 2 do
  out[#out + 1] = raw[i]
  out[#out + 1] = math.floor(tonumber(raw[i + 1]))
end
return out
