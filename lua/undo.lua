--[[
undo.lua: how one entry of a request's record is given back; put in front of refund.lua
and release.lua (after limits.lua), which both undo what a request added.
]]

-- One entry of a record: "f" or "t", then a 6-character tag (base64url).
local ENTRY = '([ft])([%w_-][%w_-][%w_-][%w_-][%w_-][%w_-])'

-- Undoes what `key` holds of the request: a sliding ZSET (how == nil, its type checked),
-- a fixed window counted at t ("f"), a bucket ("t"). True when a ZSET gave the id back.
local function undo(key, how, t, request_id)
  if how == nil then
    return redis.call('TYPE', key).ok == 'zset' and redis.call('ZREM', key, request_id) == 1
  elseif how == 't' then
    local h = redis.call('HMGET', key, 'tk', 'cap')
    -- An absent bucket is a full one: nothing to give back.
    if h[1] and h[2] then
      local tk = math.min(tonumber(h[1]) + 1, tonumber(h[2]))
      redis.call('HSET', key, 'tk', string.format('%.17g', tk))
    end
  elseif how == 'f' then
    local h = redis.call('HMGET', key, 's', 'c')
    if h[1] and tonumber(h[1]) <= t and (tonumber(h[2]) or 0) > 0 then
      redis.call('HINCRBY', key, 'c', -1)
    end
  end
  return false
end

