--[[
undo.lua: how one entry of a request's record is given back; put in front of refund.lua
and release.lua (after limits.lua), which both undo what a request added.
]]

-- One entry of a record: "f" or "t", then a 6-character tag (base64url).
local ENTRY = '([ft])([%w_-][%w_-][%w_-][%w_-][%w_-][%w_-])'

-- Undoes what `key` holds of the request: a sliding ZSET (how == nil, its type checked),
-- a fixed window counted at t ("f"), a bucket ("t"). True when a ZSET gave the id back.
-- A key left holding nothing goes, as a ZSET without members does: a window counting 0
-- and a full bucket are what an absent key means, so a check reserved and released on a
-- cluster leaves the keys as one Redis's deny does, and a refund frees the memory.
local function undo(key, how, t, request_id)
  if how == nil then
    return redis.call('TYPE', key).ok == 'zset' and redis.call('ZREM', key, request_id) == 1
  elseif how == 't' then
    local h = redis.call('HMGET', key, 'tk', 'cap')
    -- An absent bucket is a full one: nothing to give back.
    if h[1] and h[2] then
      local cap = tonumber(h[2])
      local tk = math.min(tonumber(h[1]) + 1, cap)
      if tk >= cap then
        redis.call('DEL', key)
      else
        redis.call('HSET', key, 'tk', string.format('%.17g', tk))
      end
    end
  elseif how == 'f' then
    local h = redis.call('HMGET', key, 's', 'c')
    if h[1] and tonumber(h[1]) <= t and (tonumber(h[2]) or 0) > 0 then
      if redis.call('HINCRBY', key, 'c', -1) <= 0 then
        redis.call('DEL', key)
      end
    end
  end
  return false
end

