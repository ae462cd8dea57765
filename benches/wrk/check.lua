-- wrk: POST /v1/check on the `bench` scene (benches/rules/bench.toml), users from a pool of
-- 100k, devices 100k, addresses 10k: the mix of allows and denies of a busy drop.
math.randomseed(os.time())
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  local body = string.format(
    '{"scene":"bench","user_id":"u%d","device_id":"dev%08d","ip":"10.%d.%d.%d","activity_id":"a1"}',
    math.random(1, 100000), math.random(1, 100000),
    math.random(0, 39), math.random(0, 249), math.random(1, 250))
  return wrk.format(nil, "/v1/check", nil, body)
end
