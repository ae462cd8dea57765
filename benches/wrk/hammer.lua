-- wrk: the hammering workload of benches/load.py, on the `bench` scene. 90 % of checks come
-- from 1000 accounts that are already over their limit: each hot user has its own device
-- and address, so it is user_10s (3 per 10 s) that denies them, and a deny consumes
-- nothing in vigia. The other 10 % are fresh, as in check.lua: users and devices from pools
-- of 100k, addresses from 10k.
local count = 0
function setup(thread)
  count = count + 1
  thread:set("id", count)
end

function init(args)
  -- One Lua state per thread: seed each differently so they do not repeat each other.
  math.randomseed(os.time() * 1000 + (id or 0))
end

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  local body
  if math.random() < 0.9 then
    local h = math.random(1, 1000)
    body = string.format(
      '{"scene":"bench","user_id":"hot%d","device_id":"hotdev%d","ip":"10.250.%d.%d","activity_id":"a1"}',
      h, h, math.floor(h / 250), h % 250)
  else
    body = string.format(
      '{"scene":"bench","user_id":"u%d","device_id":"dev%08d","ip":"10.%d.%d.%d","activity_id":"a1"}',
      math.random(1, 100000), math.random(1, 100000),
      math.random(0, 39), math.random(0, 249), math.random(1, 250))
  end
  return wrk.format(nil, "/v1/check", nil, body)
end
