--[[
decide.lua: one whole decision for one check, atomically: repeat detection, facts (trust
points, first sightings), signals, score, then every limit all-or-nothing. One EVALSHA is
one decision. The arithmetic mirrors src/decide/math.rs step for step (same operations on
the same doubles, in the same order), so the embedded decider and this script agree. The
decider (src/decide/redis.rs) runs it after limits.lua, which defines the limits' arithmetic
and recording, shared with check.lua (the window store's script).

A block the check has no use for is not sent (each argument and key costs Redis a parse
and a Lua string): the idempotency field only with one, the trust keys and arguments only
with [trust], the score's arguments only with [score]. Within the trust and signal blocks
an absent optional key is replaced by the records key (KEYS[1]) and an ARGV flag says so;
the script never touches a stand-in.

KEYS, in this order:
  the records key (<prefix>:<scene>:rq:<dim>:<value>, the check's first entity): the
               request's record goes to a hash of it per generation (limits.lua),
               holding, for refund.lua, what this request added to which limit key
  with [trust] (ARGV[6] = "1"), three keys: the user's trust points ZSET, the user's first
               sighting, the device's first sighting (each the records key when its flag
               says it is absent)
  for each signal, three keys: the signal's set; its all-requests set (or the records
               key, when the signal has none); its last-user key (or the records key)
  for each limit: the limit's key. Sliding limits over the same dimensions share one
               ZSET, so a key may appear more than once

ARGV[1]        request id
ARGV[2]        dry run: "1" decides and writes nothing at all (no sighting, no signal, no
               limit, no trim), "0" records; on Redis Cluster "0.<digits>" records, the
               request record ending in ".<digits>" (the reservation's stamp, limits.lua)
ARGV[3]        the repeats to look for: "r" the request's record (the caller named the
               request id), "i" the idempotency key (ARGV[10]), "ri" both, ""
               neither (a request id the service made, no idempotency key)
ARGV[4]        record TTL, ms: the request records' generation (a record lives at least
               this long, less than twice it)
ARGV[5]        now in ms, or "" to read Redis TIME
ARGV[6]        "1" when the rule set has [trust]; "0": no points (0), ages unknown, and
               the trust block is not sent
ARGV[7]        "1" when the scene has [score]; "0": the score is 0 and denies nothing, and
               the score block is not sent
ARGV[8]        S, the number of signals
ARGV[9]        L, the number of limits
then, with an idempotency key ("i" in ARGV[3]), 1: the idempotency record's field in the
               records hash ("i:<key>")
then, with [trust], 13:
               "1" when the points key is real (there is a user), "1" when the user's
               sighting key is real (there is a user), "1" when the device's sighting key
               is real (there is a device) -- on Redis Cluster each of the three may
               instead be "=<value>": the fact is given, read by another slot group's
               script (points; new_account 1, 0 or -1; new_device 1, 0 or -1), and its
               key is a stand-in; the user's may also be "u": a user is named and
               new_account is reckoned here from user_created_at (its key is a stand-in,
               no sighting is read); then user_created_at (unix ms, or ""), how long a
               sighting is kept after the last one (ms), max_points, bonus_per_point,
               discount_per_point (float), new_account.younger_than (ms, or "" without
               [trust].new_account), new_account.max_factor (float, or ""),
               new_device.younger_than (ms, or "" without [trust].new_device), the scope
               of a challenge pass on any device and on this device ("" when no pass is
               looked for: the scene never challenges, or no user or device is named; a
               group whose points are given looks for none, and may be given the fact
               instead as "=0" or "=1" in the first)
then, with [score], 3:
               the weight of new_account (float, or ""), silent_deny_at (float),
               challenge_at (float, or "" when the scene never challenges)
then 10 per signal i:
               count ("users" "devices" "ips" "nets" "requests" "user_switches"), member,
               filter ("" "new_account" "new_device" "untrusted" "unverified"), window_ms,
               max, cap,
               min_share (float, or ""), "1" when it has an all-requests key, "1" when it
               has a last-user key, weight (float, or "" when the score gives it none)
then per limit j, 6 (8 with [trust]):
               algorithm ("s" sliding window, "f" fixed window, "t" token bucket),
               window_ms, base max, retain_ms (sliding: the longest window sharing the key),
               filter (as above), tag (fixed window, bucket: how the record names the key;
               "" for sliding); with [trust] also "1" when counted per user, "1" when
               trust points raise it

Floats travel as decimal text that reads back to the same double (%.17g, or Rust's
shortest round-trip form); integers as plain decimal.

Reply, a flat array:
  {"dup", <request id that was counted>}
  {"held", <request id>}: as "dup", but its record is a reservation not yet decided (Redis
          Cluster: another attempt in flight, or denied and not yet released)
  {"judged", outcome, score, points, new_account, new_device, passed,
   S, applies_1, value_1, share_1, fired_1, ..., applies_S, value_S, share_S, fired_S,
   n, applies_1, max_1, count_1, exceeded_1, retry_after_ms_1, ..., (5 per limit)}
  outcome: "score" (the score reached silent_deny_at: no limit was touched, n = 0),
           "allow" (every applying limit had room: n = L), "deny" (one was full: n = L),
           "challenge" (every applying limit had room, the score is in [challenge_at,
           silent_deny_at) and no pass lifts it: nothing was recorded in any limit and
           no request record was written, n = L).
  score: %.17g text, in [0, 1], rounded to 1e-9 (0 without [score]).
  points: unexpired trust points, capped by max_points.
  new_account, new_device: 1 young, 0 not, -1 unknown.
  passed: 1 an unexpired challenge pass of one of the two scopes is in the points ZSET
           (member "<points>:challenge_passed:<scope>/<event_id>"), 0 none, -1 not
           looked for.
  per signal: applies 0|1, value, share (%.17g text, "" without min_share or when the
           signal does not apply), fired 0|1.
  per limit: applies 0|1 (a limit that does not apply is not evaluated: count, exceeded
           and retry are 0), the max it was held to (effective max, reported whether it
           applies or not), count (allow: including this request; deny: before it; token
           buckets: tokens spent), exceeded 0|1, retry_after_ms (0 unless exceeded).

Facts:
  points     sum of the leading integer of each member ("<points>:<type>:<event_id>") of
             the points ZSET whose score (expiry, ms) is > now; a real check trims the
             rest first.
  user age   known with [trust].new_account and a user (a real points or sighting key, or
             "u"): born = user_created_at if given, else the first sighting (read, or now
             when there is none; a real check records it, or refreshes its TTL). young =
             now - born < younger_than. Unknown without a born (no created_at and no
             sighting key).
  device age the same with the device's sighting and new_device.younger_than.

Signals (value: what is counted in the window, this request included, at most cap; a
member at t is inside while t > now - window):
  user_switches (filter not passing: value 0, nothing read or written): switched = a last
             user set inside the window (at t > now - window, like any member) and not
             this one; value = min(switches + switched, cap); with min_share (which the
             rules refuse here) share = 0, as of an empty all set; a real check adds a
             switch (member: "<ms>:<request id>", one per switch, so a request sent again
             after a score deny switches again) when switched, evicts the oldest beyond
             cap, sets the last user to this one at now (PX window + margin) and refreshes
             the set's expiry.
  others     with an all-requests key, for every request: all = min(live + absent, cap);
             a real check adds the member, evicts the oldest beyond cap from the all set
             (ZSET order: score, then member bytes) and the same members from the
             signal's set, refreshes the expiry. Then, when the filter passes: value =
             min(live + absent, cap) on the signal's set; a real check adds, evicts
             beyond cap, refreshes; with min_share, share = value / all rounded to 1e-9
             (0 when all is 0). A dry run evicts nothing but answers as the real check:
             it works out which members the all set's eviction would take (the same
             ZSET order, this member moved to now) and leaves those out of the count.
  fired      applies, value > max, and with min_share a share >= min_share.

Stored shapes (besides limits.lua's limits and records: refund.lua reads them):
  sighting   STRING unix ms of the first sighting, PX seen TTL (refreshed on each)
  signal     ZSET member = hash of the counted value (for requests: of the request id) as
             16 lowercase hex digits (the caller sends it so), score = ms
  switches   ZSET member = "<ms>:<request id>" of the switch, score = ms
  last user  STRING "<ms>:<member>": the last user's hash and when it was set (the time
             decides whether it is remembered; the expiry only cleans up)
Every key this script writes expires: signal keys window + margin after their last write,
limit keys as limits.lua says, sightings seen TTL after the last, records as limits.lua
says.
]]

-- EPS, MARGIN, int(): limits.lua.

-- Scores and shares are rounded to this (SCORE_DECIMALS in src/decide/math.rs).
local DECIMALS = 1e9
-- Members removed per ZREM call: unpack() has a stack limit.
local CHUNK = 500

local function fail(why)
  return redis.error_reply('decide.lua: ' .. why)
end

-- f64::round (half away from zero) on a double, exactly: y - floor(y) is exact for any
-- double, so the comparison with 0.5 sees the true fraction (floor(y + 0.5) would not for
-- 0.49999999999999994).
local function round_half_away(y)
  if y < 0 then
    return -round_half_away(-y)
  end
  local f = math.floor(y)
  if y - f >= 0.5 then
    f = f + 1
  end
  return f
end

-- math::round: to 1e-9.
local function round9(x)
  return round_half_away(x * DECIMALS) / DECIMALS
end

-- ---------------------------------------------------------------------------------------
-- Arguments. Everything is read and checked before the first write: a script that fails
-- halfway keeps what it wrote.
-- ---------------------------------------------------------------------------------------

local request_id = ARGV[1]
local dry_run = ARGV[2] == '1'
local has_idem = ARGV[3] == 'i' or ARGV[3] == 'ri'
local by_id = ARGV[3] == 'r' or ARGV[3] == 'ri'
local record_ttl = math.max(tonumber(ARGV[4]) or 0, 1)

local bad_arg
-- A required number; records the first bad one. The label is what (of owner n, e.g.
-- "limit", 2): put together only on a failure, not on every call (a string built per
-- argument was a sixth of the script's cost).
local function num(i, what, owner, n)
  local v = tonumber(ARGV[i])
  if v == nil and bad_arg == nil then
    local label = what
    if owner then
      label = owner .. ' ' .. n .. ' ' .. what
    end
    bad_arg = label .. ' (ARGV[' .. i .. '] = ' .. tostring(ARGV[i]) .. ') is not a number'
  end
  return v
end
-- An optional number: "" is absent.
local function opt(i, what, owner, n)
  if ARGV[i] == '' or ARGV[i] == nil then
    return nil
  end
  return num(i, what, owner, n)
end

local FILTERS = {
  [''] = true, new_account = true, new_device = true, untrusted = true, unverified = true,
}
local COUNTS = {
  users = true, devices = true, ips = true, nets = true, requests = true, user_switches = true,
}

-- A fact given as "=<value>" (see the header); nil for a key flag ("1", "0", "u").
local function given(i)
  local v = ARGV[i]
  if v == '1' or v == '0' or v == 'u' then
    return nil
  end
  local x = tonumber(string.match(v or '', '^=(-?%d+)$'))
  if x == nil and bad_arg == nil then
    bad_arg = 'fact (ARGV[' .. i .. '] = ' .. tostring(v) .. ') is neither a key flag nor =<integer>'
  end
  return x
end

local has_trust = ARGV[6] == '1'
local has_score = ARGV[7] == '1'
local n_signals = num(8, 'signal count')
local n_limits = num(9, 'limit count')
if bad_arg then
  return fail(bad_arg)
end

-- Where each block starts: a block the check has no use for is not sent at all (every
-- argument and key costs Redis a parse and a Lua string).
local a = 10
local k = 2
local idem_field = nil
if has_idem then
  idem_field = ARGV[10]
  a = 11
end

local trust = nil
local points_key, user_seen_key, device_seen_key
if has_trust then
  trust = {
    has_points = ARGV[a] == '1',
    has_user_seen = ARGV[a + 1] == '1',
    -- Redis Cluster: the user's keys are in another slot, its age is reckoned here.
    user_named = ARGV[a + 1] == 'u',
    has_device_seen = ARGV[a + 2] == '1',
    user_created = opt(a + 3, 'user_created_ms'),
    seen_ttl = math.max(num(a + 4, 'seen_ttl_ms') or 1, 1),
    max_points = num(a + 5, 'max_points'),
    bonus = num(a + 6, 'bonus_per_point'),
    discount = num(a + 7, 'discount_per_point'),
    na_younger = opt(a + 8, 'new_account younger_than'),
    na_factor = opt(a + 9, 'new_account max_factor'),
    nd_younger = opt(a + 10, 'new_device younger_than'),
    -- The ledger ids of the passes that lift the challenge band start with these
    -- ("=0" or "=1" instead: the fact is given, read by the points' slot group).
    pass_any = ARGV[a + 11] ~= '' and string.sub(ARGV[a + 11], 1, 1) ~= '='
      and (ARGV[a + 11] .. '/') or nil,
    given_passed = tonumber(string.match(ARGV[a + 11] or '', '^=([01])$')),
    pass_device = ARGV[a + 12] ~= '' and (ARGV[a + 12] .. '/') or nil,
    -- Facts another slot group read (Redis Cluster): nil when not given.
    given_points = given(a),
    given_na = given(a + 1),
    given_nd = given(a + 2),
  }
  if (trust.na_younger == nil) ~= (trust.na_factor == nil) then
    return fail('new_account needs both younger_than and max_factor')
  end
  points_key, user_seen_key, device_seen_key = KEYS[k], KEYS[k + 1], KEYS[k + 2]
  a = a + 13
  k = k + 3
end

local na_weight = nil
local deny_at = nil
local challenge_at = nil
if has_score then
  na_weight = opt(a, 'new_account weight')
  deny_at = num(a + 1, 'silent_deny_at')
  challenge_at = opt(a + 2, 'challenge_at')
  a = a + 3
end

local PER_LIMIT = has_trust and 8 or 6
if #ARGV ~= a - 1 + 10 * n_signals + PER_LIMIT * n_limits then
  return fail(#ARGV .. ' arguments for ' .. n_signals .. ' signals and ' .. n_limits .. ' limits')
end
if #KEYS ~= k - 1 + 3 * n_signals + n_limits then
  return fail(#KEYS .. ' keys for ' .. n_signals .. ' signals and ' .. n_limits .. ' limits')
end

local signals = {}
for i = 1, n_signals do
  local s = {
    count = ARGV[a],
    member = ARGV[a + 1],
    filter = ARGV[a + 2],
    window = num(a + 3, 'window', 'signal', i),
    max = num(a + 4, 'max', 'signal', i),
    cap = num(a + 5, 'cap', 'signal', i),
    min_share = opt(a + 6, 'min_share', 'signal', i),
    weight = opt(a + 9, 'weight', 'signal', i),
    key = KEYS[k],
  }
  if ARGV[a + 7] == '1' then
    s.all_key = KEYS[k + 1]
  end
  if ARGV[a + 8] == '1' then
    s.last_key = KEYS[k + 2]
  end
  if not COUNTS[s.count] then
    return fail('signal ' .. i .. ': unknown count ' .. tostring(s.count))
  end
  if not FILTERS[s.filter] then
    return fail('signal ' .. i .. ': unknown filter ' .. tostring(s.filter))
  end
  if s.count == 'user_switches' and s.last_key == nil then
    return fail('signal ' .. i .. ': user_switches without a last-user key')
  end
  if s.cap ~= nil and s.cap < 1 then
    s.cap = 1
  end
  signals[i] = s
  a = a + 10
  k = k + 3
end

local limits = {}
for j = 1, n_limits do
  -- Every field limits.lua fills in is in the constructor: the table is sized once (a
  -- field added later regrows it, a measurable cost per limit).
  local l = {
    key = KEYS[k],
    algo = ARGV[a],
    window = num(a + 1, 'window', 'limit', j),
    base_max = num(a + 2, 'max', 'limit', j),
    retain = num(a + 3, 'retain', 'limit', j),
    filter = ARGV[a + 4],
    tag = ARGV[a + 5],
    -- Sent only with [trust]: without it the max is the base max.
    per_user = has_trust and ARGV[a + 6] == '1',
    trust_bonus = has_trust and ARGV[a + 7] == '1',
    max = 0, applies = false, count = 0, after = 0, exceeded = false, retry = 0,
    start = 0, fresh = false, tokens = 0,
  }
  if not LIMIT_ALGORITHMS[l.algo] then
    return fail('limit ' .. j .. ': unknown algorithm ' .. tostring(l.algo))
  end
  if not FILTERS[l.filter] then
    return fail('limit ' .. j .. ': unknown filter ' .. tostring(l.filter))
  end
  limits[j] = l
  a = a + PER_LIMIT
  k = k + 1
end
if bad_arg then
  return fail(bad_arg)
end

-- ---------------------------------------------------------------------------------------
-- Now, and repeats: before anything is read or written.
-- ---------------------------------------------------------------------------------------

local now = clock_now(ARGV[5])
if now == nil then
  return fail('now (ARGV[5]) is not a number')
end

-- The same request id twice counts once; the same idempotency key names the first request.
local first, held = counted_before(KEYS[1], record_ttl, now, request_id, by_id, idem_field)
if first then
  return { held and 'held' or 'dup', first }
end

-- ---------------------------------------------------------------------------------------
-- Window sets. A real check trims what left the window, then counts; a dry run counts past
-- it, so both see the same members and the dry run changes nothing.
-- ---------------------------------------------------------------------------------------

-- Members still inside the window (score > now - window).
local function live_count(key, window)
  local edge = now - window
  if dry_run then
    return redis.call('ZCOUNT', key, '(' .. int(edge), '+inf')
  end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', edge)
  return redis.call('ZCARD', key)
end

-- Whether member is inside the window ("in the set after the trim").
local function live_has(key, window, member)
  local score = redis.call('ZSCORE', key, member)
  return score and tonumber(score) > now - window
end

local function zrem_all(key, members)
  for from = 1, #members, CHUNK do
    redis.call('ZREM', key, unpack(members, from, math.min(from + CHUNK - 1, #members)))
  end
end

-- ZSET order of two members of equal score: their bytes, a prefix first (memcmp; Lua's
-- own string comparison follows the locale).
local function member_before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return #a < #b
end

-- What evict() would take from key, without writing, once member is added at now and
-- over members must leave: the first over of the live members in ZSET order (score,
-- then member), member moved to now (possibly member itself). A dry run's forecast.
local function would_evict(key, window, member, over)
  local gone = {}
  if over <= 0 then
    return gone
  end
  local live = redis.call('ZRANGEBYSCORE', key, '(' .. int(now - window), '+inf',
    'WITHSCORES', 'LIMIT', 0, over + 1)
  local placed = false
  for i = 1, #live, 2 do
    local m, score = live[i], tonumber(live[i + 1])
    if m ~= member then
      if not placed and (now < score or (now == score and member_before(member, m))) then
        placed = true
        gone[#gone + 1] = member
      end
      gone[#gone + 1] = m
    end
  end
  if not placed then
    gone[#gone + 1] = member
  end
  for i = #gone, over + 1, -1 do
    gone[i] = nil
  end
  return gone
end

-- Keeps the cap newest members (oldest by score, then member, leave first); returns the
-- members evicted.
local function evict(key, cap)
  local n = redis.call('ZCARD', key)
  if n <= cap then
    return {}
  end
  local gone = redis.call('ZRANGE', key, 0, n - cap - 1)
  zrem_all(key, gone)
  return gone
end

-- ---------------------------------------------------------------------------------------
-- Facts.
-- ---------------------------------------------------------------------------------------

local points = 0
local new_account = -1
local new_device = -1
local passed = -1

-- math::is_young: now - born, saturating at 0, below younger_than.
local function young(born, younger_than)
  return math.max(now - born, 0) < younger_than
end

-- The first sighting of what key names; a real check records it (now) or refreshes it.
local function sighting(key)
  local seen = redis.call('GET', key)
  if seen then
    if not dry_run then
      redis.call('PEXPIRE', key, trust.seen_ttl)
    end
    -- A value this script did not write reads as "seen now" (new), as trust_read did.
    return tonumber(seen) or now
  end
  if not dry_run then
    redis.call('SET', key, now, 'PX', trust.seen_ttl)
  end
  return now
end

if trust then
  if trust.given_passed then
    passed = trust.given_passed
  end
  if trust.given_points then
    points = trust.given_points
  elseif trust.has_points then
    local key = points_key
    if not dry_run then
      redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    end
    if trust.pass_any then
      passed = 0
    end
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', key, '(' .. int(now), '+inf')) do
      points = points + (tonumber(string.match(m, '^(%d+):')) or 0)
      if passed == 0 then
        local id = string.match(m, '^%d+:challenge_passed:(.*)$')
        if id and (string.sub(id, 1, #trust.pass_any) == trust.pass_any
            or (trust.pass_device and string.sub(id, 1, #trust.pass_device) == trust.pass_device)) then
          passed = 1
        end
      end
    end
    points = math.min(points, trust.max_points)
  end

  local has_user = trust.has_points or trust.has_user_seen or trust.user_named
  if trust.given_na then
    new_account = trust.given_na
  elseif trust.na_younger and has_user then
    local born = trust.user_created
    if born == nil and trust.has_user_seen then
      born = sighting(user_seen_key)
    end
    if born ~= nil then
      new_account = young(born, trust.na_younger) and 1 or 0
    end
  end

  if trust.given_nd then
    new_device = trust.given_nd
  elseif trust.nd_younger and trust.has_device_seen then
    new_device = young(sighting(device_seen_key), trust.nd_younger) and 1 or 0
  end
end

-- math::passes: an unknown age is not young.
local function passes(filter)
  if filter == '' then
    return true
  elseif filter == 'new_account' then
    return new_account == 1
  elseif filter == 'new_device' then
    return new_device == 1
  elseif filter == 'unverified' then
    return passed ~= 1
  end
  return points == 0
end

-- ---------------------------------------------------------------------------------------
-- Signals, in plan order: observed before the score, so a denied try still counts.
-- ---------------------------------------------------------------------------------------

local results = {}
for i = 1, n_signals do
  local s = signals[i]
  local applies = passes(s.filter)
  local value = 0
  local share = nil
  local expiry = s.window + MARGIN

  if s.count == 'user_switches' then
    if applies then
      -- Remembered while set inside the window, whatever the key's expiry (Redis's own
      -- clock) says: the same rule as every member, on the check's clock.
      local last = redis.call('GET', s.last_key)
      local switched = false
      if last then
        local at, who = string.match(last, '^(%d+):(.*)$')
        switched = at ~= nil and tonumber(at) > now - s.window and who ~= s.member
      end
      local events = live_count(s.key, s.window)
      value = math.min(events + (switched and 1 or 0), s.cap)
      if s.min_share then
        -- math::share of an empty all set: switches have none.
        share = 0
      end
      if not dry_run then
        if switched then
          redis.call('ZADD', s.key, now, int(now) .. ':' .. request_id)
          evict(s.key, s.cap)
        end
        redis.call('SET', s.last_key, int(now) .. ':' .. s.member, 'PX', expiry)
        redis.call('PEXPIRE', s.key, expiry)
      end
    end
  else
    local all = 0
    -- A dry run: what the real check's eviction from the all set would take from the
    -- signal's set before it is counted (the real check has taken it by then).
    local gone = {}
    if s.all_key then
      local n = live_count(s.all_key, s.window)
      if not live_has(s.all_key, s.window, s.member) then
        n = n + 1
      end
      all = math.min(n, s.cap)
      if dry_run then
        gone = would_evict(s.all_key, s.window, s.member, n - s.cap)
      else
        redis.call('ZADD', s.all_key, now, s.member)
        -- The share is among the most recent members of both sets: what leaves the all
        -- set leaves the signal's set too.
        zrem_all(s.key, evict(s.all_key, s.cap))
        redis.call('PEXPIRE', s.all_key, expiry)
      end
    end
    if applies then
      local n = live_count(s.key, s.window)
      local present = live_has(s.key, s.window, s.member)
      for _, m in ipairs(gone) do
        if live_has(s.key, s.window, m) then
          n = n - 1
          if m == s.member then
            present = false
          end
        end
      end
      if not present then
        n = n + 1
      end
      value = math.min(n, s.cap)
      if not dry_run then
        redis.call('ZADD', s.key, now, s.member)
        evict(s.key, s.cap)
        redis.call('PEXPIRE', s.key, expiry)
      end
      if s.min_share then
        -- math::share
        if all == 0 then
          share = 0
        else
          share = round9(value / all)
        end
      end
    end
  end

  -- math::fires
  local fired = applies and value > s.max
  if fired and s.min_share then
    fired = share ~= nil and share >= s.min_share
  end
  results[i] = { applies = applies, value = value, share = share, fired = fired }
end

-- ---------------------------------------------------------------------------------------
-- Score (math::score): fired weights in plan order, then new_account's, minus trust,
-- clamped to [0, 1], rounded to 1e-9.
-- ---------------------------------------------------------------------------------------

local score = 0
local score_deny = false
if has_score then
  local raw = 0
  for i = 1, n_signals do
    if results[i].fired and signals[i].weight then
      raw = raw + signals[i].weight
    end
  end
  if na_weight and new_account == 1 then
    raw = raw + na_weight
  end
  local discount = points * (trust and trust.discount or 0)
  local x = raw - discount
  if x < 0 then
    x = 0
  elseif x > 1 then
    x = 1
  end
  score = round9(x)
  score_deny = score >= deny_at
end

local function reply(outcome, with_limits, use_after)
  local out = {
    'judged', outcome, score == 0 and '0' or string.format('%.17g', score), points, new_account, new_device,
    passed, n_signals,
  }
  for i = 1, n_signals do
    local r = results[i]
    out[#out + 1] = r.applies and 1 or 0
    out[#out + 1] = r.value
    out[#out + 1] = r.share and string.format('%.17g', r.share) or ''
    out[#out + 1] = r.fired and 1 or 0
  end
  if not with_limits then
    out[#out + 1] = 0
    return out
  end
  out[#out + 1] = n_limits
  for j = 1, n_limits do
    local l = limits[j]
    out[#out + 1] = l.applies and 1 or 0
    out[#out + 1] = l.max
    limit_reply(out, l, use_after)
  end
  return out
end

-- A silent deny touches no limit: a denied request consumes no quota anywhere.
if score_deny then
  return reply('score', false, false)
end

-- ---------------------------------------------------------------------------------------
-- Limits (limits.lua, as check.lua): phase 1 evaluates every applying limit against its
-- effective max; phase 2 records in all of them, only when none is exceeded.
-- ---------------------------------------------------------------------------------------

-- math::effective_max
local function effective_max(l)
  local m = l.base_max
  if trust == nil then
    return m
  end
  if trust.na_factor and new_account == 1 and l.per_user then
    m = math.floor(m * trust.na_factor)
    -- Never below 1 (written so that NaN lands on 1 too, as Rust's saturating cast does).
    if not (m >= 1) then
      m = 1
    end
  end
  if l.trust_bonus then
    m = m + points * trust.bonus
  end
  return m
end

for j = 1, n_limits do
  local l = limits[j]
  l.exceeded = false
  l.retry = 0
  l.count = 0
  -- Without [trust] the max is the base max and only an unfiltered limit applies: no call
  -- per limit (each Lua call and table write is a measurable part of a check).
  if trust == nil then
    l.max = l.base_max
    l.applies = l.filter == '' or passes(l.filter)
  else
    l.max = effective_max(l)
    l.applies = passes(l.filter)
  end
end

-- All-or-nothing: one exceeded limit and nothing is recorded anywhere.
if limits_evaluate(limits, now, dry_run) then
  return reply('deny', true, false)
end
-- math::challenged: in the band, no pass. A challenge records nothing, so the same claim
-- sent again (after the pass) is decided anew, not answered as a repeat.
if challenge_at and score >= challenge_at and passed ~= 1 then
  return reply('challenge', true, false)
end
if dry_run then
  return reply('allow', true, true)
end

-- Phase 2: the applying limits, the request record (it names only the keys written: what
-- refund.lua may undo) and the idempotency record.
limits_record(limits, now, request_id, KEYS[1], idem_field, record_ttl, string.sub(ARGV[2], 2))

return reply('allow', true, true)
