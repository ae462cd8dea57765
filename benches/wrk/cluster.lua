-- wrk: POST /v1/check on the `coupon_claim` scene of benches/rules/cluster (benches/cluster.py).
-- Users from a pool of 100k, devices 100k, addresses 10k (1k of them in the campus override's
-- 10.8.0.0/16), so a check's keys spread over the cluster's slots: on a cluster each key is
-- hash-tagged by its entity ({uid:…}, {dev:…}, {ip:…}), one slot group per entity.
-- Device ids are "dev" + 8 digits: they match [validation]'s ^[A-Za-z0-9_-]{8,64}$.
local count = 0
function setup(thread)
  count = count + 1
  thread:set("id", count)
end

function init(args)
  -- One Lua state per thread: seed each differently so they do not send the same users.
  math.randomseed(os.time() * 1000 + (id or 0))
end

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  local a = math.random(0, 9999)
  local ip
  if a < 1000 then
    ip = string.format("10.8.%d.%d", math.floor(a / 250), a % 250 + 1)
  else
    ip = string.format("198.18.%d.%d", math.floor(a / 250), a % 250 + 1)
  end
  -- Nine users in ten say they were created long ago; the tenth are new accounts. Without
  -- it every user is new, and the shipped new_accounts_in_scene signal (new accounts the
  -- majority of a drop) rightly denies the whole load after its first 50 checks.
  local user = math.random(1, 100000)
  local created = ""
  if user % 10 ~= 0 then
    created = ',"user_created_at":"2024-01-01T00:00:00Z"'
  end
  local body = string.format(
    '{"scene":"coupon_claim","user_id":"u%d","device_id":"dev%08d","ip":"%s"%s}',
    user, math.random(1, 100000), ip, created)
  return wrk.format(nil, "/v1/check", nil, body)
end
