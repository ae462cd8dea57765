--[[
check.lua: evaluate every limit of one check and, only if none is exceeded, record the
request in all of them. One EVALSHA is one atomic check: a denied request consumes nothing
in any dimension and touches no expiry.

KEYS[1]    request record key (<prefix>:<scene>:req:<request_id>); holds, for refund.lua,
           what this request added where
KEYS[2]    idempotency key; the record key again when the check carries none (ARGV[3] = 0),
           so that KEYS stays positional
KEYS[2+i]  the key of limit i, in the order of the limits. Sliding limits over the same
           dimensions share one ZSET, so a key may appear more than once

ARGV[1]    request id (the ZSET member)
ARGV[2]    dry run: "1" decides and writes nothing, "0" records
ARGV[3]    "1" when KEYS[2] is a real idempotency key, "0" otherwise
ARGV[4]    TTL of the request and idempotency records, ms
ARGV[5]    now in ms, or "" to read Redis TIME (production: every node agrees on the time;
           tests inject a manual clock here)
ARGV[6+4*(i-1) .. 9+4*(i-1)], for limit i:
           algorithm ("s" sliding window, "f" fixed window, "t" token bucket),
           window_ms, max, retain_ms (sliding: the longest window sharing the key)

Reply, a flat array:
  {"allow", "", n, count_1, exceeded_1, retry_after_ms_1, ..., count_n, exceeded_n, retry_after_ms_n}
  {"deny",  "", n, ...same triples...}
  {"dup",   <request id that was counted>, 0}
  count: allow -> the count including this request; deny -> the count before it.
  Token buckets report tokens spent (capacity minus tokens left, rounded up).
  exceeded: 1 or 0. retry_after_ms: ms until that limit admits one more (0 when not exceeded).

Stored shapes:
  sliding  ZSET  member = request id, score = ms
  fixed    HASH  s = window start (aligned: now - now % window), c = count in that window
  bucket   HASH  tk = tokens left at ts, ts = ms of last spend, cap = capacity (for refund)
  record   STRING cjson {"k": {<key>: "z" | "f:<start>" | "t"}} (what refund.lua undoes)
  idem     STRING the request id that was counted
]]

-- Tolerance for float drift in token arithmetic: tokens are stored as decimal text and
-- refilled fractionally; without it an exact refill edge could land a hair short.
local EPS = 1e-9
-- Expiry margin past the end of what a key protects (EXPIRY_MARGIN_MS in src/store/mod.rs).
local MARGIN = 1000

-- Integers as plain decimal text: Lua numbers are doubles and the default conversion may
-- use an exponent, which Redis would not take as a score, a field value or an expiry.
local function int(n)
  return string.format('%d', n)
end

local request_id = ARGV[1]
local dry_run = ARGV[2] == '1'
local has_idem = ARGV[3] == '1'
local record_ttl = math.max(tonumber(ARGV[4]) or 0, 1)

local now
if ARGV[5] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[5])
end

-- The same request id twice counts once; the same idempotency key names the first request.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {'dup', request_id, 0}
end
if has_idem then
  local first = redis.call('GET', KEYS[2])
  if first then
    return {'dup', first, 0}
  end
end

local n = #KEYS - 2
local limits = {}
local any_exceeded = false

-- Phase 1: read (and trim expired members), decide every limit. Nothing that changes a
-- count is written here.
for i = 1, n do
  local key = KEYS[2 + i]
  local base = 6 + 4 * (i - 1)
  local l = {
    key = key,
    algo = ARGV[base],
    window = tonumber(ARGV[base + 1]),
    max = tonumber(ARGV[base + 2]),
    retain = tonumber(ARGV[base + 3]),
    exceeded = false,
    retry = 0,
  }

  if l.algo == 's' then
    if not dry_run then
      -- Members at or before now - retain are outside every window sharing this key.
      redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now - l.retain))
    end
    -- A member at t counts while t > now - window.
    local lower = '(' .. int(now - l.window)
    l.count = redis.call('ZCOUNT', key, lower, '+inf')
    if l.count + 1 > l.max then
      l.exceeded = true
      -- One more fits once count - max + 1 members have left: the retry time is when the
      -- (count - max + 1)-th oldest member in the window reaches its end.
      local offset = math.max(l.count - l.max, 0)
      local m = redis.call('ZRANGEBYSCORE', key, lower, '+inf', 'WITHSCORES', 'LIMIT', offset, 1)
      if m[2] then
        l.retry = math.max(tonumber(m[2]) + l.window - now, 1)
      else
        l.retry = l.window
      end
    end
    l.after = l.count + 1

  elseif l.algo == 'f' then
    l.start = now - (now % l.window)
    local h = redis.call('HMGET', key, 's', 'c')
    local c = 0
    if h[1] and tonumber(h[1]) == l.start then
      c = tonumber(h[2]) or 0
    end
    l.count = c
    if c + 1 > l.max then
      l.exceeded = true
      l.retry = math.max(l.start + l.window - now, 1)
    end
    l.after = c + 1

  elseif l.algo == 't' then
    local h = redis.call('HMGET', key, 'tk', 'ts')
    local tokens = l.max
    if h[1] and h[2] then
      local elapsed = math.max(now - tonumber(h[2]), 0)
      -- Multiply before dividing: exact whenever the refill is a whole number of tokens.
      tokens = math.min(l.max, tonumber(h[1]) + elapsed * l.max / l.window)
    end
    l.tokens = tokens
    l.count = math.max(math.ceil(l.max - tokens - EPS), 0)
    if l.max <= 0 then
      l.exceeded = true
      l.retry = l.window
    elseif tokens < 1 - EPS then
      l.exceeded = true
      l.retry = math.max(math.ceil((1 - tokens) * l.window / l.max - EPS), 1)
    end
    l.after = math.max(math.ceil(l.max - (tokens - 1) - EPS), 0)

  else
    return redis.error_reply('check.lua: unknown algorithm ' .. tostring(l.algo))
  end

  if l.exceeded then
    any_exceeded = true
  end
  limits[i] = l
end

local function reply(kind, use_after)
  local out = {kind, '', n}
  for i = 1, n do
    local l = limits[i]
    local count = l.count
    if use_after then
      count = l.after
    end
    out[#out + 1] = count
    out[#out + 1] = l.exceeded and 1 or 0
    out[#out + 1] = l.retry
  end
  return out
end

-- All-or-nothing: one exceeded limit and nothing is recorded anywhere.
if any_exceeded then
  return reply('deny', false)
end
if dry_run then
  return reply('allow', true)
end

-- Phase 2: add to every key. A key named twice (sliding limits sharing a ZSET) is written
-- once; its expiry follows the longest retain among the limits naming it.
local record = {}
local retain_of = {}
for i = 1, n do
  local l = limits[i]
  if l.algo == 's' then
    retain_of[l.key] = math.max(retain_of[l.key] or 0, l.retain)
  end
end

for i = 1, n do
  local l = limits[i]
  local key = l.key
  if record[key] == nil then
    if l.algo == 's' then
      redis.call('ZADD', key, int(now), request_id)
      -- On every add, not only the first: the newest member decides how long the key must
      -- live (the seed's first-write expiry dropped members still inside the window).
      redis.call('PEXPIRE', key, int(retain_of[key] + MARGIN))
      record[key] = 'z'
    elseif l.algo == 'f' then
      redis.call('HSET', key, 's', int(l.start), 'c', int(l.count + 1))
      redis.call('PEXPIRE', key, int(l.start + l.window - now + MARGIN))
      record[key] = 'f:' .. int(l.start)
    else
      local tk = l.tokens - 1
      redis.call('HSET', key, 'tk', string.format('%.17g', tk), 'ts', int(now), 'cap', int(l.max))
      -- A full bucket equals an absent key: live until full again, plus the margin.
      local refill = math.ceil((l.max - tk) * l.window / l.max - EPS)
      redis.call('PEXPIRE', key, int(math.max(refill, 1) + MARGIN))
      record[key] = 't'
    end
  end
end

-- cjson turns an empty table into an array; a request with no limits still gets an object.
local encoded
if n == 0 then
  encoded = '{"k":{}}'
else
  encoded = cjson.encode({k = record})
end
redis.call('SET', KEYS[1], encoded, 'PX', int(record_ttl))
if has_idem then
  redis.call('SET', KEYS[2], request_id, 'PX', int(record_ttl))
end

return reply('allow', true)
