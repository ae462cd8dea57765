--[[
limits.lua: the limits of a check on Redis, defined once: how a sliding window, a fixed
window and a token bucket are counted and decided (phase 1), and how a request is
recorded in them, with their expiries, its request record for refund.lua and its
idempotency record (phase 2).

Not a script of its own: it is prepended to check.lua (src/store/redis.rs) and to
decide.lua (src/decide/redis.rs) at compile time, and Redis loads, hashes and runs the
composed text. It only defines locals; the script after it reads its arguments and calls
them (decide.lua also uses int() and MARGIN for its own keys). Why: check.lua is what the window store suite tests at every window edge (fixed
window edges, bucket refill, sliding peaks, shared ZSETs, retry times, refunds), while
decide.lua is what production runs; with one definition those cases test the production
arithmetic, and a fix cannot reach one script and miss the other. (A Lua error's line
number counts from the top of this file, in the composed script.)

A limit is a table the script builds from its arguments:
  key      the limit's key
  algo     "s" sliding window, "f" fixed window, "t" token bucket (LIMIT_ALGORITHMS; the
           script refuses any other before its first write)
  window   window_ms
  max      the max it is held to
  retain   retain_ms (sliding: the longest window sharing the key)
  tag      fixed window, bucket: how the request record names the key (6 characters,
           store::redis::record_tag); unused for a sliding window
  applies  true to count it; otherwise neither phase reads or writes its key
limits_evaluate fills in, for each applying limit:
  count    the count before this request (token buckets: tokens spent, that is capacity
           minus tokens left, rounded up)
  after    the count including this request (what an allow reports)
  exceeded true when one more does not fit
  retry    ms until the limit admits one more (0 when not exceeded)
  start    fixed window: the current window's start (for phase 2)
  fresh    fixed window: the key holds no count of the current window (phase 2 writes the
           start and the expiry only then)
  tokens   token bucket: tokens left now, before this request (for phase 2)

Stored shapes (refund.lua reads them):
  sliding  ZSET  member = request id, score = ms
  fixed    HASH  s = window start (aligned: now - now % window), c = count in that window
  bucket   HASH  tk = tokens left at ts, ts = ms of last spend, cap = capacity (for refund)
  records  HASH  <records key>:<g>, field = request id, value = "<ms>" then "f<tag>" or
           "t<tag>" per fixed window or bucket the request counted in: ms since the start
           of generation g (g = floor(now / record_ttl)), then what refund.lua may undo
           there (a fixed window only while its start is not after the request), then on
           Redis Cluster ".<digits>": the reservation's stamp, which release.lua matches so a
           release of one attempt never takes a later attempt with the same id. A sliding
           ZSET is not named: its member is the request id, so refund.lua removes the id
           from the caller's candidate ZSETs, which touches nothing this request did not
           add. A check with an idempotency key also writes field "i:<key>" = the request
           id that was counted, in the same hash. Field "#" (empty) marks a hash as made:
           HSET answers one more than the fields a check adds only for a new hash, which
           then gets its expiry, the end of generation g + 1 plus MARGIN. So a record lives
           at least record_ttl and less than twice it, and a repeat is looked for in
           generations g and g - 1. Why a hash per entity and generation rather than a key
           per request: a key with an expiry costs Redis ~200 B, more than the window
           members a check adds; a field of a small hash costs its own bytes.
           (Records written before 2026-12 were a STRING per request, cjson
           {"k": {<key>: "f:<start>" | "t" | "z"}}, and an idempotency key a STRING of its
           own; refund.lua still reads such records.)
Expiries: a sliding ZSET the longest retain naming it + MARGIN after its newest member, a
fixed window HASH MARGIN after the window's end, a bucket MARGIN after it is full again;
records as above.
]]

-- Tolerance for float drift in token arithmetic: tokens are stored as decimal text and
-- refilled fractionally; without it an exact refill edge could land a hair short.
local EPS = 1e-9
-- Expiry margin past the end of what a key protects (EXPIRY_MARGIN_MS in src/store/mod.rs).
local MARGIN = 1000

local LIMIT_ALGORITHMS = { s = true, f = true, t = true }

-- Integers as plain decimal text, for a number put into a string ('(' .. int(edge), a
-- member): Lua's own conversion (%.14g) may use an exponent. A number passed to
-- redis.call as an argument needs no int(): Redis converts it with %.17g, exact and
-- without an exponent for every integer below 2^53 (ms times, counts, TTLs), and a
-- string.format per argument is a measurable part of a check.
local function int(n)
  return string.format('%d', n)
end

-- Now in ms: Redis TIME when arg is "" (production: every node agrees on the time), else
-- arg itself (tests inject a manual clock here); nil when arg is not a number.
local function clock_now(arg)
  if arg == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return tonumber(arg)
end

-- The records hash of generation g (see the header).
local function records_hash(records_key, g)
  return records_key .. ':' .. int(g)
end

-- The same request id twice counts once; the same idempotency key names the first request.
-- Returns the request id that was counted, or nil when this request is new, and whether
-- its record is still a reservation (Redis Cluster: it ends in ".<stamp>" until the node
-- that made it commits it, having allowed the check, or releases it; a copy must then wait
-- for that decision, not pass as a repeat of an allow). by_id: false when the service made
-- the request id for this check (a fresh ULID cannot have been counted: no lookup).
-- idem_field: "i:<key>", nil when the check carries no idempotency key. record_ttl: the
-- generation's length.
local function counted_before(records_key, record_ttl, now, request_id, by_id, idem_field)
  if not (by_id or idem_field) then
    return nil
  end
  local g = math.floor(now / record_ttl)
  local this, last = records_hash(records_key, g), records_hash(records_key, g - 1)
  local function record(id)
    return redis.call('HGET', this, id) or redis.call('HGET', last, id)
  end
  local first, value = nil, nil
  if by_id then
    value = record(request_id)
    if value then
      first = request_id
    end
  end
  if not first and idem_field then
    first = redis.call('HGET', this, idem_field) or redis.call('HGET', last, idem_field)
    if first then
      value = record(first)
    end
  end
  if not first then
    return nil
  end
  -- Record tags never hold a '.' (store::redis::record_tag): only a stamp ends so.
  return first, (value and string.find(value, '%.%d+$')) ~= nil
end

-- Phase 1 for one limit: reads its key and decides it (see the fields above). Nothing is
-- written: a sliding ZSET is trimmed when a request is recorded in it (phase 2), so a deny
-- costs one call per sliding limit, and ZCOUNT's lower bound already leaves the members
-- outside the window uncounted. (dry_run: unused since the trim left this phase.)
local function limit_evaluate(l, now, dry_run)
  local key = l.key
  l.exceeded = false
  l.retry = 0

  if l.algo == 's' then
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
    -- fresh: the key holds no count of this window yet (phase 2 sets its start and expiry)
    l.fresh = true
    if h[1] and tonumber(h[1]) == l.start then
      c = tonumber(h[2]) or 0
      l.fresh = false
    end
    l.count = c
    if c + 1 > l.max then
      l.exceeded = true
      l.retry = math.max(l.start + l.window - now, 1)
    end
    l.after = c + 1

  else
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
  end
  return l.exceeded
end

-- Phase 1: evaluates every applying limit, in order. Returns true when one is exceeded.
local function limits_evaluate(limits, now, dry_run)
  local any_exceeded = false
  for i = 1, #limits do
    local l = limits[i]
    if l.applies and limit_evaluate(l, now, dry_run) then
      any_exceeded = true
    end
  end
  return any_exceeded
end

-- Appends what both scripts' replies say of limit l: count (with after: including this
-- request, as an allow reports it; else before it; a limit that does not apply keeps the
-- count its script gave it), exceeded 1 or 0, retry_after_ms.
local function limit_reply(out, l, after)
  local count = l.count
  if after and l.applies then
    count = l.after
  end
  out[#out + 1] = count
  out[#out + 1] = l.exceeded and 1 or 0
  out[#out + 1] = l.retry
end

-- Phase 2, only when no limit is exceeded and not a dry run (all-or-nothing: one exceeded
-- limit and nothing is recorded anywhere): adds the request to every applying limit, then
-- writes its request record (ending in stamp, "" or nil off a cluster) and, with
-- idem_field (nil when the check carries none), its idempotency record.
local function limits_record(limits, now, request_id, records_key, idem_field, record_ttl, stamp)
  -- A key named twice (sliding limits sharing a ZSET) is written once; its expiry follows
  -- the longest retain among the applying limits naming it.
  local record = {}
  local written = {}
  local retain_of = {}
  -- A key in which some limit found a member inside its window.
  local counted_in = {}
  for i = 1, #limits do
    local l = limits[i]
    if l.applies and l.algo == 's' then
      retain_of[l.key] = math.max(retain_of[l.key] or 0, l.retain)
      if l.count > 0 then
        counted_in[l.key] = true
      end
    end
  end

  for i = 1, #limits do
    local l = limits[i]
    local key = l.key
    if l.applies and not written[key] then
      written[key] = true
      if l.algo == 's' then
        -- Members at or before now - retain are outside every window sharing this key.
        -- Trimmed only when some limit found a member inside its window. A key with none
        -- is nearly always absent (a new user, device or address: nothing to trim, and a
        -- Redis call is ~4 % of the bench scene's script); else it holds only members
        -- past every window, which no count sees. Those stay until an add that finds a
        -- member inside, or the key's expiry: it is live only while its newest member is
        -- within retain + MARGIN, so they outlive only adds that each land in that margin.
        if counted_in[key] then
          redis.call('ZREMRANGEBYSCORE', key, '-inf', now - retain_of[key])
        end
        redis.call('ZADD', key, now, request_id)
        -- On every add, not only the first: the newest member decides how long the key
        -- must live (the seed's first-write expiry dropped members still inside the window).
        redis.call('PEXPIRE', key, retain_of[key] + MARGIN)
        -- Not in the record: see the header.
      elseif l.algo == 'f' then
        if l.fresh then
          redis.call('HSET', key, 's', l.start, 'c', l.count + 1)
          -- The expiry is a point in time (the window's end plus the margin), the same for
          -- every request of the window: set once, when the window's first count is.
          redis.call('PEXPIRE', key, l.start + l.window - now + MARGIN)
        else
          redis.call('HSET', key, 'c', l.count + 1)
        end
        record[#record + 1] = 'f' .. l.tag
      else
        local tk = l.tokens - 1
        redis.call('HSET', key, 'tk', string.format('%.17g', tk), 'ts', now, 'cap', l.max)
        -- A full bucket equals an absent key: live until full again, plus the margin.
        local refill = math.ceil((l.max - tk) * l.window / l.max - EPS)
        redis.call('PEXPIRE', key, math.max(refill, 1) + MARGIN)
        record[#record + 1] = 't' .. l.tag
      end
    end
  end

  -- The record: when, and the fixed windows and buckets written (see the header).
  local g = math.floor(now / record_ttl)
  local start = g * record_ttl
  local hash = records_hash(records_key, g)
  local value = int(now - start) .. table.concat(record) .. (stamp or '')
  local added
  if idem_field then
    added = redis.call('HSET', hash, request_id, value, idem_field, request_id, '#', '') - 2
  else
    added = redis.call('HSET', hash, request_id, value, '#', '') - 1
  end
  if added == 1 then
    redis.call('PEXPIRE', hash, start + 2 * record_ttl - now + MARGIN)
  end
end
