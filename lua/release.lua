--[[
release.lua: settles one attempt at a check once the node knows what became of it.
- "release": gives back what the attempt recorded and forgets its record, so the same
  request id sent again is a new check. On Redis Cluster, a slot group's reservation of a
  check the node denied (another group's limit was full, a score deny, a group failed);
  on one Redis, a call that failed or timed out, whose script may have run after the node
  answered the check without it (the node waits for Redis's late reply first).
- "commit" (Redis Cluster: the node allowed the check; sent to the main group, the one
  holding the request's idempotency record): the record stops being a reservation (its
  ".<stamp>" is dropped), so a copy sent later is a repeat of an allowed request. Until
  then a copy finds a reservation and is told to come back ("held" in check.lua and
  decide.lua), never allowed.
Idempotent: a second call, or one for an attempt that recorded nothing, finds no record
ending in its stamp and does nothing.

KEYS[1]    the records key (<prefix>:<scene>:rq:...): the attempt's record is a field of
           its hash of generation g or g - 1 (limits.lua)
KEYS[2..]  the candidate keys (the limits the attempt was sent); none for a commit

ARGV[1]    request id
ARGV[2]    record TTL (the generation's length), ms
ARGV[3]    now in ms, or "" to read Redis TIME
ARGV[4]    the idempotency field ("i:<key>") the attempt wrote, or ""
ARGV[5]    the attempt's stamp as it ends the record (store::redis::Stamp): ".<digits>" a
           cluster reservation, "~<digits>" an attempt on one Redis; only a record ending
           in it is this attempt's: another attempt with the same request id (a retry
           after a 503, admitted meanwhile) has its own stamp and is not touched
ARGV[6]    "release" or "commit"
ARGV[6+i]  the tag of candidate KEYS[1+i] (store::redis::record_tag)

Reply: 1 when a record was released or committed, 0 when there was none.
]]

-- clock_now(), records_hash(): limits.lua; ENTRY, undo(): undo.lua.

local request_id = ARGV[1]
local gen = tonumber(ARGV[2]) or 0
local now = clock_now(ARGV[3])
if gen <= 0 or now == nil then
  return redis.error_reply('release.lua: record TTL (ARGV[2]) or now (ARGV[3]) is not a number')
end
local g = math.floor(now / gen)
local mark = ARGV[5]
if not string.match(mark, '^[.~]%d+$') then
  return redis.error_reply('release.lua: stamp (ARGV[5]) is not "." or "~" then digits')
end
local commit = ARGV[6] == 'commit'
if not commit and ARGV[6] ~= 'release' then
  return redis.error_reply('release.lua: ARGV[6] is neither "release" nor "commit"')
end
if commit and string.sub(mark, 1, 1) ~= '.' then
  return redis.error_reply('release.lua: only a reservation (".<digits>") is committed')
end
for _, gg in ipairs({ g, g - 1 }) do
  local hash = records_hash(KEYS[1], gg)
  local value = redis.call('HGET', hash, request_id)
  if value and string.sub(value, -#mark) == mark then
    if commit then
      -- Rewriting a field keeps the hash's expiry.
      redis.call('HSET', hash, request_id, string.sub(value, 1, -(#mark + 1)))
      return 1
    end
    local ms = string.match(value, '^%d+')
    if not ms then
      return redis.error_reply('release.lua: unreadable request record ' .. request_id .. ' in ' .. hash)
    end
    local t = gg * gen + tonumber(ms)
    local named = {}
    for kind, tag in string.gmatch(string.sub(value, #ms + 1), ENTRY) do
      named[tag] = kind
    end
    for i = 2, #KEYS do
      undo(KEYS[i], named[ARGV[i + 5]], t, request_id)
    end
    redis.call('HDEL', hash, request_id)
    local idem = ARGV[4]
    if idem ~= '' and redis.call('HGET', hash, idem) == request_id then
      redis.call('HDEL', hash, idem)
    end
    return 1
  end
end
return 0
