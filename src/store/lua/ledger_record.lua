-- Count one agent run's usage in the ledger (store/ledger.rs), once per work id: the
-- run's entry in its PR's (or issue's) ledger hash is the marker, so a re-reported
-- result finds it and counts nothing. Every key carries the ledger's one hash tag.
--
-- KEYS[1] the PR's or issue's ledger hash   KEYS[2] the day's hash   KEYS[3] the month's
-- ARGV[1] the run's field (`run:<work id>`)   ARGV[2] the run's JSON
-- ARGV[3] expiry of the three keys (seconds)   ARGV[4] n = number of buckets
-- ARGV[5 .. 4+n] the buckets the day and month hashes count the run under
-- ARGV[5+n ..] the metrics' values, in the order of METRICS below
-- Reply: 1 when counted, 0 when the work id was already counted.
local METRICS = {'usd', 'in', 'out', 'rsn', 'crd', 'cwr', 'runs'}
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return 0
end
local n = tonumber(ARGV[4])
local first_value = 5 + n
for m = 1, #METRICS do
  local v = ARGV[first_value + m - 1]
  if v ~= '0' then
    redis.call('HINCRBY', KEYS[1], METRICS[m], v)
    for b = 5, 4 + n do
      local field = ARGV[b] .. '|' .. METRICS[m]
      redis.call('HINCRBY', KEYS[2], field, v)
      redis.call('HINCRBY', KEYS[3], field, v)
    end
  end
end
for k = 1, 3 do
  redis.call('EXPIRE', KEYS[k], ARGV[3])
end
return 1
