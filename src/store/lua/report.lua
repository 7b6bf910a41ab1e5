-- Accept one work result (results API, results stream or `shepherd agents`): the work id
-- must be active — or have ended because the agent's own push superseded its claim,
-- whose result is still recorded on that attempt (docs/state-machine.md) — and only its
-- first report is queued, as an internal event on the shard's events stream. A result
-- for work that was cancelled, expired or already reported, or that never existed, is
-- refused.
--
-- KEYS[1] work index (hash)   KEYS[2] ended marker of the id   KEYS[3] reported marker
-- KEYS[4] events stream
-- ARGV[1] work id   ARGV[2] marker TTL (seconds)   ARGV[3..] fields of the events entry
-- Reply: {'queued', <stream id>} | {'unknown'} | {'ended'} | {'reported'}
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  local ended = redis.call('GET', KEYS[2])
  if not ended then
    return {'unknown'}
  end
  -- '1': ended for good; anything else is the owner of a superseded claim.
  if ended == '1' then
    return {'ended'}
  end
end
if not redis.call('SET', KEYS[3], '1', 'NX', 'EX', ARGV[2]) then
  return {'reported'}
end
local id = redis.call('XADD', KEYS[4], '*', unpack(ARGV, 3))
return {'queued', id}
